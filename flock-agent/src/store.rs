//! The allocation store under `--state-dir`: one small JSON file per attachment, written
//! durably (temp file, fsync, rename, fsync of the directory), so an interrupted write never
//! leaves a torn record and a crash never loses a committed allocation.
//!
//! Layout: `<state-dir>/store.json` (`{"format":1}`) and `<state-dir>/allocations/
//! <containerId>.<ifName>.json`. A record that cannot be read stops the agent with an error
//! naming the file: the store never silently starts empty.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use flock_cni_proto::durable;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The on-disk format this agent writes and reads.
pub const STORE_FORMAT: u32 = 1;

/// Where an allocation is in its life cycle (DESIGN §7).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    /// Addresses chosen, the kernel may be half-programmed: undone at start-up.
    Pending,
    /// The kernel is programmed and the result was (or will be) returned.
    Committed,
}

/// The pod an allocation belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, when the runtime passed one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// One attachment's allocation: everything needed to rebuild its CNI result, check or tear
/// down its kernel state, and release its addresses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AllocationRecord {
    /// The record format (`STORE_FORMAT`).
    pub format: u32,
    /// Pending or committed.
    pub state: RecordState,
    /// The CNI network name (GC is scoped to it).
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The kernel boot ID at ADD: a different one at start-up means the netns is gone.
    pub boot_id: String,
    /// The pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The pod's IPv6 address (a /128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The pod's IPv4 address (a /32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    /// Extra fixed addresses (`addresses` annotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
    /// Anycast addresses (`anycast` annotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anycast: Vec<IpAddr>,
    /// MTU of the veth pair.
    pub mtu: u32,
    /// The host-side veth.
    pub host_if: String,
    /// Host veth MAC, once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_mac: String,
    /// Pod interface MAC, once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_mac: String,
}

impl AllocationRecord {
    /// The attachment key: `(containerId, ifName)`.
    pub fn key(&self) -> AttachmentKey {
        AttachmentKey {
            container_id: self.container_id.clone(),
            if_name: self.if_name.clone(),
        }
    }

    /// Every address this record holds in the pools (pod addresses and fixed ones; anycast
    /// addresses are shared and not pooled).
    pub fn pooled_addresses(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = Vec::new();
        v.extend(self.ipv6.map(IpAddr::V6));
        v.extend(self.ipv4.map(IpAddr::V4));
        v.extend(self.addresses.iter().copied());
        v
    }
}

/// Identifies one attachment (CNI's container ID and interface name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttachmentKey {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
}

impl AttachmentKey {
    /// The record's file: `<containerId>:<ifName>.json`. Neither part can hold a `:` (the
    /// shim's and the agent's validation refuse it), so no two keys share a file.
    fn file_name(&self) -> String {
        format!("{}:{}.json", self.container_id, self.if_name)
    }

    /// The file name of earlier agents (`<containerId>.<ifName>.json`), ambiguous (`a.b` +
    /// `c` and `a` + `b.c`): still read, and renamed when the agent opens the store.
    fn legacy_file_name(&self) -> String {
        format!("{}.{}.json", self.container_id, self.if_name)
    }
}

/// The durable store.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct StoreMeta {
    format: u32,
}

/// Whether reading the records may change the directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// The agent's own open: removes leftover temporary files, renames legacy file names.
    Owner,
    /// Anyone else (`flock-agent allocations`): changes nothing, even beside a running agent.
    ReadOnly,
}

impl Store {
    /// Opens (creating if needed) the store in `state_dir` and reads every record.
    ///
    /// Leftover temp files of interrupted writes are removed; a record that cannot be read
    /// or parsed is an error naming the file.
    pub fn open(state_dir: &Path) -> Result<(Store, Vec<AllocationRecord>)> {
        let dir = state_dir.join("allocations");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Store {
                op: "create directory",
                path: dir.clone(),
                source,
            })?;
        if !check_meta(state_dir)? {
            let bytes = serde_json::to_vec(&StoreMeta {
                format: STORE_FORMAT,
            })
            .expect("serialize store meta");
            write_durably(state_dir, "store.json", &bytes, 0o600)?;
        }
        let records = read_records(&dir, Access::Owner)?;
        Ok((Store { dir }, records))
    }

    /// Reads every record without changing anything: safe beside a running agent (its
    /// in-flight temporary files are skipped, not removed). A state directory without a
    /// store holds no record.
    pub fn read(state_dir: &Path) -> Result<Vec<AllocationRecord>> {
        let dir = state_dir.join("allocations");
        if !check_meta(state_dir)? && !dir.exists() {
            return Ok(Vec::new());
        }
        read_records(&dir, Access::ReadOnly)
    }

    /// Writes (creates or replaces) a record durably.
    pub fn put(&self, record: &AllocationRecord) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(record).expect("serialize allocation record");
        write_durably(&self.dir, &record.key().file_name(), &bytes, 0o600)
    }

    /// Deletes a record durably; a missing record is not an error.
    pub fn delete(&self, key: &AttachmentKey) -> Result<()> {
        let path = self.dir.join(key.file_name());
        match fs::remove_file(&path) {
            Ok(()) => durable::sync_dir(&self.dir).map_err(store_error),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Store {
                op: "delete",
                path,
                source,
            }),
        }
    }

    /// Whether a record could be written now: creates and removes an empty file in the
    /// records' directory (no fsync: this asks the filesystem, it stores nothing). Cheap
    /// enough for every STATUS. The name is not a record's (no `.json`), so a crash between
    /// the two steps leaves a file the loader skips.
    pub fn probe_writable(&self) -> Result<()> {
        static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!(".probe-{n}"));
        fs::write(&path, b"").map_err(|source| Error::Store {
            op: "write a probe file in",
            path: path.clone(),
            source,
        })?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Store {
                op: "remove the probe file",
                path,
                source,
            }),
        }
    }

    /// The directory holding the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Checks `store.json`: `Ok(false)` when there is none yet, an error when it is not a
/// store this agent knows.
fn check_meta(state_dir: &Path) -> Result<bool> {
    let meta_path = state_dir.join("store.json");
    match fs::read(&meta_path) {
        Ok(bytes) => {
            let meta: StoreMeta =
                serde_json::from_slice(&bytes).map_err(|e| Error::CorruptStore {
                    path: meta_path.clone(),
                    reason: e.to_string(),
                })?;
            if meta.format != STORE_FORMAT {
                return Err(Error::CorruptStore {
                    path: meta_path,
                    reason: format!(
                        "store format {} is not {STORE_FORMAT}, the one this agent knows",
                        meta.format
                    ),
                });
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(Error::Store {
            op: "read",
            path: meta_path,
            source,
        }),
    }
}

fn read_records(dir: &Path, access: Access) -> Result<Vec<AllocationRecord>> {
    let list_error = |source| Error::Store {
        op: "list",
        path: dir.to_owned(),
        source,
    };
    let mut records = Vec::new();
    for entry in fs::read_dir(dir).map_err(list_error)? {
        let entry = entry.map_err(list_error)?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if durable::is_temp_name(&name) {
            // An interrupted write (or, beside a running agent, one in progress): the rename
            // never happened, the old record (if any) is intact.
            if access == Access::Owner {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(".json") {
            continue;
        }
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            // Deleted by a running agent between the listing and the read.
            Err(e) if access == Access::ReadOnly && e.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(source) => {
                return Err(Error::Store {
                    op: "read",
                    path,
                    source,
                });
            }
        };
        let record: AllocationRecord =
            serde_json::from_slice(&bytes).map_err(|e| Error::CorruptStore {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if record.format != STORE_FORMAT {
            return Err(Error::CorruptStore {
                path,
                reason: format!("record format {} is not {STORE_FORMAT}", record.format),
            });
        }
        let key = record.key();
        if key.file_name() != name {
            if key.legacy_file_name() != name {
                return Err(Error::CorruptStore {
                    path,
                    reason: format!(
                        "holds container {:?} interface {:?}, which belong in {}",
                        record.container_id,
                        record.if_name,
                        key.file_name()
                    ),
                });
            }
            if access == Access::Owner {
                let to = dir.join(key.file_name());
                fs::rename(&path, &to).map_err(|source| Error::Store {
                    op: "rename a record to its unambiguous name",
                    path: path.clone(),
                    source,
                })?;
                durable::sync_dir(dir).map_err(store_error)?;
            }
        }
        records.push(record);
    }
    records.sort_by_key(AllocationRecord::key);
    Ok(records)
}

/// Writes `bytes` to `dir/name` so that after a crash the file holds either its old content
/// or the new one, never a mix (`flock_cni_proto::durable`, shared with the shim's DEL queue).
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    durable::write_file(dir, name, bytes, mode)
        .map(drop)
        .map_err(store_error)
}

fn store_error(e: durable::DurableError) -> Error {
    Error::Store {
        op: e.op,
        path: e.path,
        source: e.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cid: &str) -> AllocationRecord {
        AllocationRecord {
            format: STORE_FORMAT,
            state: RecordState::Pending,
            network: "flock".into(),
            container_id: cid.into(),
            if_name: "eth0".into(),
            netns: "/run/netns/x".into(),
            boot_id: "b".into(),
            pod: Some(PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: String::new(),
            }),
            ipv6: Some("2001:db8:1::5".parse().unwrap()),
            ipv4: Some("10.1.0.5".parse().unwrap()),
            addresses: vec![],
            anycast: vec![],
            mtu: 1500,
            host_if: "flock01234567".into(),
            host_mac: String::new(),
            pod_mac: String::new(),
        }
    }

    #[test]
    fn put_read_delete_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (store, records) = Store::open(dir.path()).unwrap();
        assert!(records.is_empty());
        let mut a = record("aaa");
        store.put(&a).unwrap();
        a.state = RecordState::Committed;
        store.put(&a).unwrap();
        store.put(&record("bbb")).unwrap();
        let (store, records) = Store::open(dir.path()).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0], a);
        store.delete(&a.key()).unwrap();
        store.delete(&a.key()).unwrap();
        let (_, records) = Store::open(dir.path()).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].container_id, "bbb");
    }

    #[test]
    fn torn_temp_file_is_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        store.put(&record("aaa")).unwrap();
        let tmp = store.dir().join(".tmp-aaa.eth0.json");
        fs::write(&tmp, b"{\"format\":1,\"sta").unwrap();
        let (_, records) = Store::open(dir.path()).unwrap();
        assert_eq!(records.len(), 1);
        assert!(!tmp.exists());
    }

    #[test]
    fn corrupt_record_stops_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let bad = store.dir().join("ccc.eth0.json");
        fs::write(&bad, b"{not json").unwrap();
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ccc.eth0.json"), "{err}");
    }

    #[test]
    fn unknown_store_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("store.json"), b"{\"format\":7}").unwrap();
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("store format 7"), "{err}");
    }

    #[test]
    fn keys_that_join_alike_get_files_of_their_own() {
        // `a.b` + `c` and `a` + `b.c` shared the file `a.b.c.json` before.
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let mut one = record("a.b");
        one.if_name = "c".into();
        let mut two = record("a");
        two.if_name = "b.c".into();
        store.put(&one).unwrap();
        store.put(&two).unwrap();
        let (store, records) = Store::open(dir.path()).unwrap();
        assert_eq!(records, vec![two.clone(), one.clone()]);
        store.delete(&one.key()).unwrap();
        assert_eq!(Store::read(dir.path()).unwrap(), vec![two]);
    }

    #[test]
    fn reading_beside_a_running_agent_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        store.put(&record("aaa")).unwrap();
        // A write the running agent has in progress.
        let in_flight = store.dir().join(".tmp-bbb:eth0.json");
        fs::write(&in_flight, b"{\"format\":1").unwrap();
        let records = Store::read(dir.path()).unwrap();
        assert_eq!(records.len(), 1);
        assert!(
            in_flight.exists(),
            "a read-only listing removed an in-flight file"
        );
        assert!(
            Store::read(&dir.path().join("nothing-here"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn records_of_earlier_agents_are_read_and_renamed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let r = record("aaa");
        let legacy = store.dir().join("aaa.eth0.json");
        fs::write(&legacy, serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(Store::read(dir.path()).unwrap(), vec![r.clone()]);
        assert!(legacy.exists(), "read-only");
        let (store, records) = Store::open(dir.path()).unwrap();
        assert_eq!(records, vec![r]);
        assert!(!legacy.exists());
        assert!(store.dir().join("aaa:eth0.json").exists());
    }
}
