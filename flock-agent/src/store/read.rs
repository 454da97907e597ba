//! Reading the store back: `store.json` and every record, as the agent's own open (which may
//! tidy the directory) or read-only beside a running agent.

use std::fs;
use std::path::Path;

use flock_cni_proto::durable;
use tracing::warn;

use super::{AllocationRecord, STORE_FORMAT, StoreMeta, store_error};
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
            if meta.format != STORE_FORMAT {
                return Err(Error::CorruptStore {
                    path: meta_path,
                    reason: format!(
                        "store format {} is not {STORE_FORMAT}, the one this agent knows",
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
            // An interrupted write (or, beside a running agent, one in progress): the rename
            // never happened, the old record (if any) is intact.
            if access != Access::ReadOnly {
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
        let record: AllocationRecord = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) if access == Access::Owner(Torn::DropWithWarning) => {
                warn!(file = %path.display(), error = %e,
                    "dropping an unreadable record of a previous boot (torn by a power cut)");
                if let Err(e) = fs::remove_file(&path) {
                    warn!(file = %path.display(), error = %e, "removing it failed");
                }
                continue;
            }
            Err(e) => {
                return Err(Error::CorruptStore {
                    path,
                    reason: e.to_string(),
                });
            }
        };
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
            if access != Access::ReadOnly {
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
