//! Reading the store back: `store.json` and every record, as the agent's own open (which may
//! tidy the directory) or read-only beside a running agent.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use flock_rpc::durable;
use tracing::warn;

use super::slots::{self, SLOTS_FILE};
use super::{AllocationRecord, AttachmentKey, IN_PLACE_MAX, SLOTS_STORE_FORMAT, STORE_FORMAT};
use super::{StoreMeta, store_error};
use crate::{Error, Result};

/// Whether reading the records may change the directory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// The agent's own open: removes leftover temporary files, renames legacy file names,
    /// and treats an unreadable record as `Torn` says.
    Owner(Torn),
    /// Anyone else (`flock-agent allocations`): changes nothing, even beside a running agent.
    ReadOnly,
}

/// What an unreadable record means.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Torn {
    /// The store was last opened in another boot: a power cut may have torn it, and its
    /// records are released anyway.
    DropWithWarning,
    /// Nothing but damage explains it: stop, naming the file.
    Stop,
}

/// Reads `store.json`: `Ok(None)` when there is none yet, an error when it is not a store
/// this agent knows.
pub(super) fn check_meta(state_dir: &Path) -> Result<Option<StoreMeta>> {
    let meta_path = state_dir.join("store.json");
    match fs::read(&meta_path) {
        Ok(bytes) => {
            let meta: StoreMeta =
                serde_json::from_slice(&bytes).map_err(|e| Error::CorruptStore {
                    path: meta_path.clone(),
                    reason: e.to_string(),
                })?;
            if meta.format != STORE_FORMAT && meta.format != SLOTS_STORE_FORMAT {
                return Err(Error::CorruptStore {
                    path: meta_path,
                    reason: format!(
                        "store format {} is neither {STORE_FORMAT} nor {SLOTS_STORE_FORMAT}, \
                         the ones this agent knows",
                        meta.format
                    ),
                });
            }
            Ok(Some(meta))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Store {
            op: "read",
            path: meta_path,
            source,
        }),
    }
}

pub(super) fn read_records(dir: &Path, access: Access) -> Result<Vec<AllocationRecord>> {
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
            // An interrupted write or a spare file (or, beside a running agent, one in use):
            // no record name points at it, the records are intact.
            if access != Access::ReadOnly {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(".json") {
            continue;
        }
        let record = match read_one(&path, &name, access)? {
            Some(r) => r,
            None => continue,
        };
        let key = record.key();
        if key.file_name() != name && access != Access::ReadOnly {
            // A legacy name (`read_one` let no other mismatch through).
            let to = dir.join(key.file_name());
            fs::rename(&path, &to).map_err(|source| Error::Store {
                op: "rename a record to its unambiguous name",
                path: path.clone(),
                source,
            })?;
            durable::sync_dir(dir).map_err(store_error)?;
        }
        records.push(record);
    }
    records.sort_by_key(AllocationRecord::key);
    Ok(records)
}

/// How many times a reader beside a running agent reads a record that changed under it.
const READ_ONLY_TRIES: usize = 3;

/// One record file: `Ok(None)` when it is to be skipped (gone, or dropped as torn).
///
/// A record whose content is unreadable or names another attachment is, for the agent's own
/// open, torn by a power cut (dropped with a warning, when the store was last opened in
/// another boot) or damage (an error naming the file). A reader beside a running agent reads
/// it again first: the agent recycles files (`Store::put`), and a reader that opened a
/// record's file just before the agent exchanged it away may see it being rewritten.
fn read_one(path: &Path, name: &str, access: Access) -> Result<Option<AllocationRecord>> {
    let mut tries = 0;
    loop {
        tries += 1;
        let bytes = match fs::read(path) {
            Ok(b) => b,
            // Deleted by a running agent between the listing and the read.
            Err(e) if access == Access::ReadOnly && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(source) => {
                return Err(Error::Store {
                    op: "read",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let problem = match serde_json::from_slice::<AllocationRecord>(&bytes) {
            Err(e) => e.to_string(),
            Ok(record) if record.format != STORE_FORMAT => {
                // Not a torn record: one of another agent, which this one must not guess at.
                return Err(Error::CorruptStore {
                    path: path.to_owned(),
                    reason: format!("record format {} is not {STORE_FORMAT}", record.format),
                });
            }
            Ok(record) => {
                let key = record.key();
                if key.file_name() == name || key.legacy_file_name() == name {
                    return Ok(Some(record));
                }
                format!(
                    "holds container {:?} interface {:?}, which belong in {}",
                    record.container_id,
                    record.if_name,
                    key.file_name()
                )
            }
        };
        match access {
            Access::ReadOnly if tries < READ_ONLY_TRIES => continue,
            Access::Owner(Torn::DropWithWarning) => {
                warn!(file = %path.display(), error = %problem,
                    "dropping a record of a previous boot that is unreadable or names another \
                     attachment (torn by a power cut)");
                if let Err(e) = fs::remove_file(path) {
                    warn!(file = %path.display(), error = %e, "removing it failed");
                }
                return Ok(None);
            }
            _ => {
                return Err(Error::CorruptStore {
                    path: path.to_owned(),
                    reason: problem,
                });
            }
        }
    }
}

/// What the slots file holds.
pub(super) struct SlotsRead {
    /// The file, open for writing too (the agent's own open), or `None` (a read-only one, or
    /// no file).
    pub file: Option<File>,
    /// How many pages it holds.
    pub count: u64,
    /// The pages that hold no record, the lowest last.
    pub blank: Vec<u64>,
    /// Each record and its page.
    pub records: Vec<(u64, AllocationRecord)>,
}

/// Reads the slots file of the records' directory `dir` (for the agent's own open, creating
/// it): every page a record or blank. A record that also has a file of its own is not taken:
/// that file is the newer (`Store::put`), and the agent's own open blanks the page.
///
/// A page that is neither a record nor blank, or holds the same attachment as another page,
/// is treated as `read_one` treats such a record file, naming the file and the page.
pub(super) fn read_slots(
    dir: &Path,
    access: Access,
    named: &HashSet<AttachmentKey>,
) -> Result<SlotsRead> {
    let path = dir.join(SLOTS_FILE);
    let opened = match access {
        Access::Owner(_) => fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path),
        Access::ReadOnly => File::open(&path),
    };
    let file = match opened {
        Ok(file) => file,
        Err(e) if access == Access::ReadOnly && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(SlotsRead {
                file: None,
                count: 0,
                blank: Vec::new(),
                records: Vec::new(),
            });
        }
        Err(source) => {
            return Err(Error::Store {
                op: "open",
                path,
                source,
            });
        }
    };
    let io_error = |op: &'static str| {
        let path = path.clone();
        move |source| Error::Store { op, path, source }
    };
    let count = slots::pages(file.metadata().map_err(io_error("stat"))?.len());
    let mut blank = Vec::new();
    let mut records = Vec::new();
    let mut seen: HashMap<AttachmentKey, u64> = HashMap::new();
    let mut buf = vec![0u8; IN_PLACE_MAX];
    for page in 0..count {
        let mut tries = 0;
        loop {
            tries += 1;
            let n = slots::read_page(&file, page, &mut buf).map_err(io_error("read"))?;
            let bytes = slots::trim(&buf[..n]);
            if bytes.is_empty() {
                blank.push(page);
                break;
            }
            let problem = match serde_json::from_slice::<AllocationRecord>(bytes) {
                Err(e) => e.to_string(),
                Ok(record) if record.format != STORE_FORMAT => {
                    return Err(Error::CorruptStore {
                        path,
                        reason: format!(
                            "page {page}: record format {} is not {STORE_FORMAT}",
                            record.format
                        ),
                    });
                }
                Ok(record) => {
                    let key = record.key();
                    if named.contains(&key) {
                        if access != Access::ReadOnly {
                            slots::write_page(&file, page, b"")
                                .map_err(io_error("blank a page of"))?;
                            blank.push(page);
                        }
                        break;
                    }
                    match seen.get(&key) {
                        Some(other) => format!(
                            "holds container {:?} interface {:?}, as page {other} does",
                            key.container_id, key.if_name
                        ),
                        None => {
                            seen.insert(key, page);
                            records.push((page, record));
                            break;
                        }
                    }
                }
            };
            match access {
                Access::ReadOnly if tries < READ_ONLY_TRIES => continue,
                Access::Owner(Torn::DropWithWarning) => {
                    warn!(file = %path.display(), page, error = %problem,
                        "dropping a record of a previous boot that is unreadable or names an \
                         attachment another page holds (torn by a power cut)");
                    slots::write_page(&file, page, b"").map_err(io_error("blank a page of"))?;
                    blank.push(page);
                    break;
                }
                _ => {
                    return Err(Error::CorruptStore {
                        path,
                        reason: format!("page {page}: {problem}"),
                    });
                }
            }
        }
    }
    blank.reverse();
    Ok(SlotsRead {
        file: (access != Access::ReadOnly).then_some(file),
        count,
        blank,
        records,
    })
}
