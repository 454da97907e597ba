//! The DEL queue: DELs the agent may not have completed (the shim could not
//! deliver them, or got no answer), one small file per attachment, written
//! durably so none is lost; the agent drains it at start-up before it serves
//! anything (DESIGN §2).

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::rpc::{self, DecodeError, Request};

/// A failure of the queue's file operations.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A file system operation failed.
    #[error("del queue: {op} {}", path.display())]
    Io {
        /// What was being done (`create directory`, `write`, `rename`…).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The request cannot name a queue file (container ID or interface name
    /// would escape the directory).
    #[error("del queue: cannot queue container {container_id:?} interface {if_name:?}: {reason}")]
    BadName {
        /// The request's container ID.
        container_id: String,
        /// The request's interface name.
        if_name: String,
        /// Why.
        reason: &'static str,
    },
}

/// One queued file and its request, or why the file cannot be decoded
/// (the agent should report and keep such a file rather than lose a DEL).
pub type PendingDel = (PathBuf, Result<Request, DecodeError>);

/// The queue directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelQueue {
    dir: PathBuf,
}

impl DelQueue {
    /// The queue in `dir` (created on first [`enqueue`](Self::enqueue)).
    pub fn new(dir: impl Into<PathBuf>) -> DelQueue {
        DelQueue { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file an attachment's DEL is kept in: `<containerId>.<ifName>.json`.
    /// A second DEL for the same attachment replaces the first. Both parts
    /// may contain dots, so two attachments can share that name (`a.b` +
    /// `c`, `a` + `b.c`); the later one then goes to
    /// `<containerId>.<ifName>.<n>.json`, the first such file that is free or
    /// already holds the same attachment.
    pub fn file_for(&self, req: &Request) -> Result<PathBuf, QueueError> {
        let bad = |reason| QueueError::BadName {
            container_id: req.container_id.clone(),
            if_name: req.if_name.clone(),
            reason,
        };
        flock_cni_proto::env::validate_container_id(&req.container_id)
            .map_err(|_| bad("invalid container ID"))?;
        flock_cni_proto::env::validate_if_name(&req.if_name)
            .map_err(|_| bad("invalid interface name"))?;
        for n in 0u32.. {
            let name = match n {
                0 => format!("{}.{}.json", req.container_id, req.if_name),
                n => format!("{}.{}.{n}.json", req.container_id, req.if_name),
            };
            let path = self.dir.join(name);
            let same_attachment = match fs::read(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => true,
                Err(source) => {
                    return Err(QueueError::Io {
                        op: "read",
                        path,
                        source,
                    });
                }
                // An undecodable file is kept for the agent to report, not
                // overwritten.
                Ok(bytes) => rpc::decode_request(&bytes)
                    .is_ok_and(|q| q.container_id == req.container_id && q.if_name == req.if_name),
            };
            if same_attachment {
                return Ok(path);
            }
        }
        Err(bad("no free queue file name"))
    }

    /// Writes `req` durably: directory created with mode 0700, the request
    /// line written to a temporary file in the same directory, fsynced,
    /// renamed into place, and the directory fsynced. Returns the file.
    pub fn enqueue(&self, req: &Request) -> Result<PathBuf, QueueError> {
        let target = self.file_for(req)?;
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| QueueError::Io { op, path, source }
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io("create directory", &self.dir))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        crate::durable::write_file(&self.dir, &name, &rpc::encode_line(req), 0o600).map_err(
            |e| QueueError::Io {
                op: e.op,
                path: e.path,
                source: e.source,
            },
        )?;
        Ok(target)
    }

    /// Every queued file, sorted by path, with its decoded request (or why
    /// it cannot be decoded). Temporary files of interrupted writes are
    /// skipped. A missing directory is an empty queue.
    pub fn pending(&self) -> Result<Vec<PendingDel>, QueueError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(QueueError::Io {
                    op: "list",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| QueueError::Io {
                op: "list",
                path: self.dir.clone(),
                source,
            })?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".json") && !crate::durable::is_temp_name(&name) {
                paths.push(entry.path());
            }
        }
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let bytes = fs::read(&p).map_err(|source| QueueError::Io {
                    op: "read",
                    path: p.clone(),
                    source,
                })?;
                Ok((p, rpc::decode_request(&bytes)))
            })
            .collect()
    }

    /// Removes a handled file (already gone is success).
    pub fn remove(&self, path: &Path) -> Result<(), QueueError> {
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(QueueError::Io {
                op: "remove",
                path: path.to_path_buf(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::Op;
    use std::os::unix::fs::PermissionsExt;

    fn del(cid: &str, ifname: &str) -> Request {
        Request {
            v: 1,
            op: Op::Del,
            container_id: cid.into(),
            netns: String::new(),
            if_name: ifname.into(),
            args: String::new(),
            path: "/opt/cni/bin".into(),
            config: serde_json::json!({"cniVersion": "1.1.0", "name": "flock", "type": "flock"}),
        }
    }

    #[test]
    fn enqueue_pending_remove() {
        let tmp = tempfile::tempdir().unwrap();
        let q = DelQueue::new(tmp.path().join("a/del-queue"));
        assert!(q.pending().unwrap().is_empty());
        let p2 = q.enqueue(&del("bbb", "eth0")).unwrap();
        let p1 = q.enqueue(&del("aaa", "eth0")).unwrap();
        q.enqueue(&del("aaa", "eth0")).unwrap();
        assert_eq!(p1.file_name().unwrap(), "aaa.eth0.json");
        let mode = fs::metadata(q.dir()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        fs::write(q.dir().join("junk.json"), b"{").unwrap();
        fs::write(q.dir().join(".ccc.eth0.json.1.tmp"), b"partial").unwrap();
        let pending = q.pending().unwrap();
        let names: Vec<_> = pending
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["aaa.eth0.json", "bbb.eth0.json", "junk.json"]);
        assert_eq!(pending[0].1.as_ref().unwrap(), &del("aaa", "eth0"));
        assert!(pending[2].1.is_err());
        q.remove(&p1).unwrap();
        q.remove(&p1).unwrap();
        q.remove(&p2).unwrap();
        assert_eq!(q.pending().unwrap().len(), 1);
    }

    #[test]
    fn dotted_names_that_collide_get_their_own_file() {
        let tmp = tempfile::tempdir().unwrap();
        let q = DelQueue::new(tmp.path());
        let a = q.enqueue(&del("a.b", "c")).unwrap();
        let b = q.enqueue(&del("a", "b.c")).unwrap();
        assert_eq!(a.file_name().unwrap(), "a.b.c.json");
        assert_eq!(b.file_name().unwrap(), "a.b.c.1.json");
        // Repeating either replaces its own file.
        assert_eq!(q.enqueue(&del("a", "b.c")).unwrap(), b);
        assert_eq!(q.enqueue(&del("a.b", "c")).unwrap(), a);
        let reqs: Vec<_> = q
            .pending()
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.unwrap())
            .collect();
        // Sorted by path: "a.b.c.1.json" before "a.b.c.json".
        assert_eq!(reqs, [del("a", "b.c"), del("a.b", "c")]);
    }

    #[test]
    fn refuses_names_that_escape() {
        let q = DelQueue::new("/nonexistent");
        assert!(matches!(
            q.enqueue(&del("../x", "eth0")),
            Err(QueueError::BadName { .. })
        ));
        assert!(matches!(
            q.enqueue(&del("x", "a/b")),
            Err(QueueError::BadName { .. })
        ));
    }
}
