//! The one place that enters network namespaces.
//!
//! A short-lived dedicated std thread opens the namespace file, calls `setns`
//! and then does its work there (opens a netlink socket, reads or writes
//! `/proc/sys`). A netlink socket keeps talking to the namespace it was
//! opened in, so the socket is handed back to the async world and the thread
//! ends. Tokio workers never change namespace.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};
use rtnetlink::Handle;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Where the host side of pods lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NsTarget {
    /// The namespace of the calling process (production: the agent runs in
    /// the node's namespace).
    Current,
    /// A namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`).
    Path(PathBuf),
}

impl NsTarget {
    /// How errors name this namespace.
    pub fn describe(&self) -> String {
        match self {
            NsTarget::Current => "current netns".to_owned(),
            NsTarget::Path(p) => p.display().to_string(),
        }
    }
}

/// The node's namespace with its cached netlink connection.
///
/// Open once, share it (`Arc<NodeNs>`): the connection is opened on first
/// use and reused by every call, and the anycast membership it keeps (see
/// [`crate::sync_anycast`]) is only coherent if one `NodeNs` per namespace
/// is used. The connection runs as a task of the tokio runtime that opened
/// it; if that task ends, the next call opens a new one.
#[derive(Debug)]
pub struct NodeNs {
    pub(crate) target: NsTarget,
    conn: Mutex<Option<NlConn>>,
    /// Anycast address → host veth → the pod's IPv6 address (the IPv6
    /// nexthop's gateway). The lock serialises every anycast
    /// read-modify-write of this namespace.
    pub(crate) anycast: Mutex<HashMap<IpAddr, BTreeMap<String, Option<Ipv6Addr>>>>,
}

impl NodeNs {
    /// The agent's own namespace.
    pub fn current() -> NodeNs {
        NodeNs::new(NsTarget::Current)
    }

    /// A namespace file, e.g. a stand-in node namespace in tests.
    pub fn at(path: impl Into<PathBuf>) -> NodeNs {
        NodeNs::new(NsTarget::Path(path.into()))
    }

    /// A node namespace for `target`.
    pub fn new(target: NsTarget) -> NodeNs {
        NodeNs {
            target,
            conn: Mutex::new(None),
            anycast: Mutex::new(HashMap::new()),
        }
    }

    /// Which namespace this is.
    pub fn target(&self) -> &NsTarget {
        &self.target
    }

    /// The cached netlink handle: opened on first use, reopened if its
    /// driver task has ended (socket error, or the runtime that ran it shut
    /// down).
    pub(crate) async fn handle(&self) -> Result<Handle> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref()
            && !c.task.is_finished()
        {
            return Ok(c.handle.clone());
        }
        let fresh = NlConn::open(&self.target).await?;
        let handle = fresh.handle.clone();
        *conn = Some(fresh);
        Ok(handle)
    }

    pub(crate) fn name(&self) -> String {
        self.target.describe()
    }
}

/// A netlink connection whose driver task is aborted on drop, so a
/// short-lived connection never leaks its socket.
#[derive(Debug)]
pub(crate) struct NlConn {
    pub(crate) handle: Handle,
    task: JoinHandle<()>,
}

impl Drop for NlConn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NlConn {
    /// Opens a netlink socket in `target` (on a namespace thread for a path).
    pub(crate) async fn open(target: &NsTarget) -> Result<NlConn> {
        let ns = target.describe();
        let rt = tokio::runtime::Handle::current();
        let open = move || {
            let _guard = rt.enter();
            rtnetlink::new_connection().map_err(|source| Error::Connect { ns, source })
        };
        let (connection, handle, _messages) = match target {
            NsTarget::Current => open()?,
            NsTarget::Path(path) => in_netns(path, open).await?,
        };
        let task = tokio::spawn(connection);
        Ok(NlConn { handle, task })
    }
}

/// Runs `f` on a fresh std thread that first enters the namespace at `path`.
pub(crate) async fn in_netns<T, F>(path: &Path, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let file = File::open(path).map_err(|source| Error::OpenNetns {
        path: path.to_owned(),
        source,
    })?;
    let owned = path.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("flock-netns".to_owned())
        .spawn(move || {
            let result = setns(&file, CloneFlags::CLONE_NEWNET)
                .map_err(|errno| Error::EnterNetns {
                    path: owned,
                    source: std::io::Error::from(errno),
                })
                .and_then(|()| f());
            drop(file);
            let _ = tx.send(result);
        })
        .map_err(|source| Error::NetnsThread {
            path: path.to_owned(),
            source,
        })?;
    rx.await.map_err(|_| Error::NetnsThread {
        path: path.to_owned(),
        source: std::io::Error::other("namespace thread panicked"),
    })?
}

/// Runs the blocking `f` on a fresh std thread that first enters the namespace at `path`;
/// a process `f` spawns starts in that namespace too (the agent runs `nft` this way).
pub async fn blocking_in_netns<T, F>(path: &Path, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    in_netns(path, move || Ok(f())).await
}

/// Runs `f` in `target`: directly for the current namespace, on a namespace
/// thread for a path.
pub(crate) async fn run_in<T, F>(target: &NsTarget, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match target {
        NsTarget::Current => f(),
        NsTarget::Path(path) => in_netns(path, f).await,
    }
}

/// One sysctl and the value flock wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sysctl {
    /// Path under `/proc/sys`, e.g. `net/ipv4/ip_forward`.
    pub(crate) path: String,
    pub(crate) want: &'static str,
}

/// Reads each sysctl and writes it only when it differs (must run inside the
/// namespace).
pub(crate) fn ensure_sysctls(ns: &str, sysctls: &[Sysctl]) -> Result<()> {
    for s in sysctls {
        let actual = read_sysctl(ns, &s.path)?;
        if actual != s.want {
            std::fs::write(format!("/proc/sys/{}", s.path), s.want).map_err(|source| {
                Error::SysctlWanted {
                    path: s.path.clone(),
                    ns: ns.to_owned(),
                    actual,
                    want: s.want,
                    source,
                }
            })?;
        }
    }
    Ok(())
}

/// Reads a sysctl, trimmed (must run inside the namespace).
pub(crate) fn read_sysctl(ns: &str, path: &str) -> Result<String> {
    std::fs::read_to_string(format!("/proc/sys/{path}"))
        .map(|s| s.trim().to_owned())
        .map_err(|source| Error::Sysctl {
            op: "read",
            path: path.to_owned(),
            ns: ns.to_owned(),
            source,
        })
}
