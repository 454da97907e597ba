//! `pod-records`: a chained CNI plugin that keeps one record per attachment — which pod
//! (from the CRI's `CNI_ARGS`) holds which addresses (from the previous plugin's result) —
//! in `<dataDir>/<network>/<containerID>-<ifname>`, for a node-local inventory that needs no
//! API server. It uses every verb:
//!
//! - ADD writes the record and passes the previous result on unchanged;
//! - DEL removes it (a record already gone is no error: DEL may come more than once);
//! - CHECK fails when the record is missing or names other addresses than the result;
//! - STATUS fails when `dataDir` cannot be written;
//! - GC removes the records of the network whose attachment is not in the valid list, all
//!   it can, and reports every one it could not.
//!
//! A record is named `<containerID>:<ifname>`: neither may hold a `:` (CNI's container IDs
//! are letters, digits, `_`, `-` and `.`; Linux refuses `:` in interface names), so no two
//! attachments share one. Files starting with `.` are this plugin's own (a record being
//! written, STATUS's probe) and GC leaves them.
//!
//! ```json
//! { "type": "pod-records", "dataDir": "/var/lib/cni/pod-records" }
//! ```

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use flock_cni_proto::serde_json::{self, Value, json};
use flock_cni_proto::{Call, CniArgs, CniError, CniResult, ErrorCode, Plugin, skel};

/// This plugin's error code for a record that does not match (CNI leaves 100+ to plugins).
const RECORD_MISMATCH: u32 = 100;

struct PodRecords;

/// The network's record directory, from `dataDir`.
fn network_dir(call: &Call<'_>) -> Result<PathBuf, CniError> {
    let data_dir = match call.conf.extra.get("dataDir") {
        Some(Value::String(d)) if Path::new(d).is_absolute() => PathBuf::from(d),
        Some(other) => {
            return Err(CniError::new(
                ErrorCode::InvalidNetworkConfig,
                format!("plugin pod-records: dataDir {other} is not an absolute path"),
            ));
        }
        None => {
            return Err(CniError::new(
                ErrorCode::InvalidNetworkConfig,
                "plugin pod-records: dataDir is required (an absolute path)",
            ));
        }
    };
    if call.conf.name.is_empty() || call.conf.name.contains('/') {
        return Err(CniError::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "plugin pod-records: network name {:?} cannot name a directory",
                call.conf.name
            ),
        ));
    }
    Ok(data_dir.join(&call.conf.name))
}

fn record_name(container_id: &str, if_name: &str) -> String {
    format!("{container_id}:{if_name}")
}

fn record_path(call: &Call<'_>) -> Result<PathBuf, CniError> {
    Ok(network_dir(call)?.join(record_name(&call.env.container_id, &call.env.if_name)))
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> CniError {
    CniError::new(ErrorCode::IoFailure, format!("{what} {}", path.display()))
        .with_details(e.to_string())
}

fn prev_result(call: &Call<'_>) -> Result<CniResult, CniError> {
    call.conf.prev_result()?.ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "plugin pod-records of network {:?} must follow a plugin that assigns addresses: no prevResult",
                call.conf.name
            ),
        )
    })
}

/// What the record says of an attachment.
fn record(call: &Call<'_>, result: &CniResult) -> Result<Value, CniError> {
    let args = CniArgs::parse(&call.env.args)?;
    let pod = match (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => String::new(),
    };
    let addresses: Vec<String> = result.ips.iter().map(|ip| ip.address.to_string()).collect();
    Ok(json!({ "pod": pod, "addresses": addresses }))
}

impl Plugin for PodRecords {
    fn add(&self, call: &Call<'_>) -> Result<CniResult, CniError> {
        let result = prev_result(call)?;
        let path = record_path(call)?;
        let dir = network_dir(call)?;
        fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
        // Written whole, then renamed: a reader never sees half a record.
        let tmp = dir.join(format!(
            ".{}.tmp",
            record_name(&call.env.container_id, &call.env.if_name)
        ));
        let body = serde_json::to_vec(&record(call, &result)?).expect("a JSON value");
        fs::write(&tmp, body).map_err(|e| io_error("write", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io_error("rename to", &path, e))?;
        Ok(result)
    }

    fn del(&self, call: &Call<'_>) -> Result<(), CniError> {
        let path = record_path(call)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io_error("remove", &path, e)),
            _ => Ok(()),
        }
    }

    fn check(&self, call: &Call<'_>) -> Result<(), CniError> {
        let result = prev_result(call)?;
        let path = record_path(call)?;
        let text = fs::read(&path).map_err(|e| io_error("read", &path, e))?;
        let kept: Value = serde_json::from_slice(&text).map_err(|e| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("record {}", path.display()),
            )
            .with_details(e.to_string())
        })?;
        let want = record(call, &result)?;
        if kept["addresses"] != want["addresses"] {
            return Err(CniError::new(
                ErrorCode::Plugin(RECORD_MISMATCH),
                format!(
                    "record {} names addresses {}, the result {}",
                    path.display(),
                    kept["addresses"],
                    want["addresses"]
                ),
            ));
        }
        Ok(())
    }

    fn status(&self, call: &Call<'_>) -> Result<(), CniError> {
        let dir = network_dir(call)?;
        fs::create_dir_all(&dir).map_err(|e| {
            CniError::new(
                ErrorCode::PluginNotAvailable,
                format!("record directory {}", dir.display()),
            )
            .with_details(e.to_string())
        })?;
        let probe = dir.join(format!(".status-{}", std::process::id()));
        fs::write(&probe, b"")
            .and_then(|()| fs::remove_file(&probe))
            .map_err(|e| {
                CniError::new(
                    ErrorCode::PluginNotAvailable,
                    format!("record directory {} is not writable", dir.display()),
                )
                .with_details(e.to_string())
            })
    }

    fn gc(&self, call: &Call<'_>) -> Result<(), CniError> {
        let Some(valid) = call.conf.gc_attachments() else {
            return Err(CniError::new(
                ErrorCode::InvalidNetworkConfig,
                "plugin pod-records: GC without cni.dev/valid-attachments",
            ));
        };
        let dir = network_dir(call)?;
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("list", &dir, e)),
        };
        let keep: Vec<String> = valid
            .iter()
            .map(|a| record_name(&a.container_id, &a.ifname))
            .collect();
        // Every stale record that can go goes; the ones that cannot are reported together.
        let mut failed = Vec::new();
        for entry in entries {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(e) => {
                    failed.push(format!("{}: {e}", dir.display()));
                    continue;
                }
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') || keep.contains(&name) {
                continue;
            }
            if let Err(e) = fs::remove_file(&path) {
                failed.push(format!("{}: {e}", path.display()));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                ErrorCode::IoFailure,
                format!("remove {} stale records", failed.len()),
            )
            .with_details(failed.join("; ")))
        }
    }
}

fn main() {
    skel::run(&PodRecords)
}
