//! Crash-safe file replacement, shared by the shim's DEL queue and the agent's store and
//! installer: the file holds either its old content or the new one, never a mix.
//!
//! [`write_file`] survives a power cut too (fsync of the file and of its directory);
//! [`replace_file`] survives a crash of the writing process — the page cache keeps what was
//! written and the rename is atomic — at a fraction of the cost, for data that a power cut
//! makes worthless anyway (the agent's records are bound to the boot they were made in).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A failed step of [`write_file`].
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct DurableError {
    /// The step: `create`, `chmod`, `write`, `fsync`, `rename`, `fsync directory`.
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

static TEMP_FILES: AtomicU32 = AtomicU32::new(0);

/// Whether `name` is one of [`write_file`]'s temporary files (left behind only by a crash
/// between creating it and renaming it: safe to delete).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.')
}

/// Writes `bytes` to `dir/name` with permissions `mode`: a temporary file in the same
/// directory (its name starts with a dot), fsync, rename over `name`, fsync of the directory.
/// Returns the final path.
pub fn write_file(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<PathBuf, DurableError> {
    write_with(dir, name, bytes, mode, true)
}

/// Writes `bytes` to `dir/name` with permissions `mode` atomically but without fsync: a
/// temporary file in the same directory, renamed over `name`. A crash of the process leaves
/// the old content or the new; a power cut may leave either, an empty file, or none.
pub fn replace_file(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<PathBuf, DurableError> {
    write_with(dir, name, bytes, mode, false)
}

fn write_with(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
    durable: bool,
) -> Result<PathBuf, DurableError> {
    let n = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let path = dir.join(name);
    let step = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| DurableError { op, path, source }
    };
    let write = || -> Result<(), DurableError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(step("create", &tmp))?;
        // `mode` at creation is masked by the umask; set it exactly before the file is visible.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(step("chmod", &tmp))?;
        file.write_all(bytes).map_err(step("write", &tmp))?;
        if durable {
            file.sync_all().map_err(step("fsync", &tmp))?;
        }
        fs::rename(&tmp, &path).map_err(step("rename", &path))
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if durable {
        sync_dir(dir)?;
    }
    Ok(path)
}

/// Makes the directory's entries (a rename, an unlink) durable.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| DurableError {
            op: "fsync directory",
            path: dir.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_with_mode_and_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!("flock-durable-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        write_file(&dir, "f.json", b"old", 0o600).unwrap();
        let path = write_file(&dir, "f.json", b"new", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["f.json"]);
        assert!(!is_temp_name("f.json") && is_temp_name(".f.json.1.0.tmp"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replace_without_fsync_is_still_a_rename_of_a_whole_file() {
        let dir = std::env::temp_dir().join(format!("flock-replace-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        replace_file(&dir, "r.json", b"old", 0o600).unwrap();
        let path = replace_file(&dir, "r.json", b"new", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["r.json"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
