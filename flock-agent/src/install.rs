//! `flock-agent install-cni`: what the DaemonSet's init container runs on every node — copy
//! the shim into the CNI binary directory and write the network configuration list, each
//! atomically (temp file in the same directory, fsync, rename), so a runtime never execs a
//! half-copied shim nor reads a half-written conflist.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::store::write_durably;
use crate::{Error, Result};

/// The conflist's file name: sorts first so runtimes pick flock.
pub const CONFLIST_NAME: &str = "01-flock.conflist";

/// What `install-cni` installs.
#[derive(Clone, Debug)]
pub struct InstallPlan {
    /// The shim binary to copy.
    pub shim: PathBuf,
    /// The CNI binary directory (`/opt/cni/bin`).
    pub bin_dir: PathBuf,
    /// The CNI configuration directory (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// The network name.
    pub network: String,
    /// The agent socket the shim connects to.
    pub agent_socket: PathBuf,
    /// The MTU of pod interfaces.
    pub mtu: u32,
}

/// The conflist flock installs (CNI 1.1.0, flock alone, with the runtime capabilities it uses).
pub fn conflist(plan: &InstallPlan) -> serde_json::Value {
    json!({
        "cniVersion": "1.1.0",
        "name": plan.network,
        "plugins": [{
            "type": "flock",
            "agentSocket": plan.agent_socket,
            "mtu": plan.mtu,
            "capabilities": { "io.kubernetes.cri.pod-annotations": true }
        }]
    })
}

/// Installs the shim and the conflist; running it again with the same inputs changes nothing
/// a reader can see (each file is replaced atomically by identical bytes).
pub fn install(plan: &InstallPlan) -> Result<Vec<PathBuf>> {
    let shim = std::fs::read(&plan.shim).map_err(|source| Error::ReadFile {
        path: plan.shim.clone(),
        source,
    })?;
    create_dir(&plan.bin_dir)?;
    create_dir(&plan.conf_dir)?;
    write_durably(&plan.bin_dir, "flock", &shim, 0o755)?;
    let mut text = serde_json::to_string_pretty(&conflist(plan)).expect("conflist serializes");
    text.push('\n');
    write_durably(&plan.conf_dir, CONFLIST_NAME, text.as_bytes(), 0o644)?;
    Ok(vec![
        plan.bin_dir.join("flock"),
        plan.conf_dir.join(CONFLIST_NAME),
    ])
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Store {
        op: "create directory",
        path: dir.to_owned(),
        source,
    })
}
