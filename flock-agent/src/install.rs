//! `flock-agent install-cni`: what the DaemonSet's init container runs on every node — copy
//! the shim into the CNI binary directory and write the network configuration list, each
//! atomically (temp file in the same directory, fsync, rename), so a runtime never execs a
//! half-copied shim nor reads a half-written conflist.
//!
//! The conflist says `cniVersion` 1.0.0 and offers 1.1.0 in `cniVersions` (CNI 1.1):
//! containerd 1.6 and 1.7 fail every pod on a 1.1.0 result (`unsupported CNI result version
//! "1.1.0"`) and ignore `cniVersions`, while a runtime that knows CNI 1.1 picks 1.1.0 from it.

use std::path::{Path, PathBuf};

use flock_cni_proto::{CniVersion, Conflist, NetConf};
use flock_rpc::FlockNetConf;
use flock_rpc::durable::{self, DurableError};
use serde_json::json;

use crate::{Error, Result};

/// The conflist's file name: sorts first so runtimes pick flock.
pub const CONFLIST_NAME: &str = "01-flock.conflist";

/// The conflist's default `cniVersion`: the newest version containerd 1.6 and 1.7 accept a
/// result in.
pub const DEFAULT_CNI_VERSION: CniVersion = CniVersion::V1_0_0;

/// A reference plugin (github.com/containernetworking/plugins) the conflist chains after
/// flock, taking flock's result as its `prevResult`. The node provides its binary, as it
/// provides `loopback`, which containerd runs for every sandbox: the distribution's package of
/// the reference plugins installs both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chained {
    /// `portmap`: a pod's `hostPort`s (the runtime passes them as the `portMappings`
    /// capability), DNAT from the node's addresses to the pod's.
    Portmap,
    /// `bandwidth`: the `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` annotations
    /// (the `bandwidth` capability), shaping on the host veth flock's result names.
    Bandwidth,
}

impl Chained {
    /// What `--chain` accepts.
    pub const ALL: [Chained; 2] = [Chained::Portmap, Chained::Bandwidth];

    /// The plugin's `type`: its binary's name in the CNI binary directory.
    pub fn name(self) -> &'static str {
        match self {
            Chained::Portmap => "portmap",
            Chained::Bandwidth => "bandwidth",
        }
    }

    /// Its entry in the conflist's `plugins`, after flock's.
    fn config(self) -> serde_json::Value {
        let capability = match self {
            Chained::Portmap => "portMappings",
            Chained::Bandwidth => "bandwidth",
        };
        json!({ "type": self.name(), "capabilities": { capability: true } })
    }
}

/// What `install-cni` chains unless told otherwise: `portmap`, so that a pod's `hostPort`
/// works as Kubernetes documents it (and its conformance suite checks).
pub const DEFAULT_CHAIN: [Chained; 1] = [Chained::Portmap];

/// [`DEFAULT_CHAIN`] as `--chain` spells it.
pub const DEFAULT_CHAIN_FLAG: &str = "portmap";

/// One `--chain` value: a plugin of [`Chained::ALL`], or `none` (`Ok(None)`) for a conflist of
/// flock alone; the error names the value and what is accepted.
pub fn parse_chained(text: &str) -> std::result::Result<Option<Chained>, String> {
    if text == "none" {
        return Ok(None);
    }
    Chained::ALL
        .into_iter()
        .find(|c| c.name() == text)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{text:?} is not a plugin flock chains; one of {}, or none",
                Chained::ALL.map(Chained::name).join(", ")
            )
        })
}

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
    /// The conflist's `cniVersion` (one of [`CniVersion::SUPPORTED`]); `cniVersions` offers it
    /// and every newer supported version.
    pub cni_version: CniVersion,
    /// The agent socket the shim connects to.
    pub agent_socket: PathBuf,
    /// Where the shim queues a DEL the agent may not have completed: the agent's DEL queue.
    pub del_queue_dir: PathBuf,
    /// The MTU of pod interfaces; `None`: the agent takes the uplink's.
    pub mtu: Option<u32>,
    /// The reference plugins chained after flock, in this order; each must be in `bin_dir`.
    pub chain: Vec<Chained>,
}

/// `text` as a `cniVersion` flock supports, for the `--cni-version` flag; the error names the
/// value and the supported versions.
pub fn parse_cni_version(text: &str) -> std::result::Result<CniVersion, String> {
    let version: CniVersion = text.parse().map_err(|e| format!("{e}"))?;
    if version.is_supported() {
        Ok(version)
    } else {
        Err(format!(
            "cniVersion {version} is not supported; flock supports {}",
            supported_list()
        ))
    }
}

fn supported_list() -> String {
    CniVersion::SUPPORTED
        .iter()
        .map(CniVersion::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The conflist flock installs: flock, with the runtime capabilities it uses, then the plan's
/// chained plugins with theirs; `cniVersion` from the plan and `cniVersions` listing it and
/// every newer version flock supports.
pub fn conflist(plan: &InstallPlan) -> serde_json::Value {
    let versions: Vec<String> = CniVersion::SUPPORTED
        .iter()
        .filter(|v| **v >= plan.cni_version)
        .map(CniVersion::to_string)
        .collect();
    let mut flock = json!({
        "type": "flock",
        "agentSocket": plan.agent_socket,
        "delQueueDir": plan.del_queue_dir,
        "capabilities": { "io.kubernetes.cri.pod-annotations": true }
    });
    if let Some(mtu) = plan.mtu {
        flock["mtu"] = mtu.into();
    }
    let mut plugins = vec![flock];
    plugins.extend(plan.chain.iter().map(|c| c.config()));
    json!({
        "cniVersion": plan.cni_version.to_string(),
        "cniVersions": versions,
        "name": plan.network,
        "plugins": plugins
    })
}

/// Installs the shim and the conflist; running it again with the same inputs changes nothing
/// a reader can see (each file is replaced atomically by identical bytes).
///
/// Before writing anything it checks the conflist the way the shim will read it (a list
/// whose every pod would fail is not installed): a supported `cniVersion`, absolute
/// `agentSocket` and `delQueueDir`, an `mtu` in 68..=65535, and every chained plugin's binary
/// in `bin_dir` (the runtime would fail every ADD without it).
pub fn install(plan: &InstallPlan) -> Result<Vec<PathBuf>> {
    let conflist_path = plan.conf_dir.join(CONFLIST_NAME);
    let mut text = serde_json::to_string_pretty(&conflist(plan)).expect("conflist serializes");
    text.push('\n');
    check_conflist(plan, &text).map_err(|source| Error::Install {
        op: "check the conflist",
        path: conflist_path.clone(),
        source,
    })?;
    for chained in &plan.chain {
        let path = plan.bin_dir.join(chained.name());
        if !path.is_file() {
            return Err(Error::Install {
                op: "find the chained plugin",
                path,
                source: format!(
                    "not there: install the reference CNI plugins \
                     (github.com/containernetworking/plugins) into {}, or leave {} out of \
                     --chain (--chain none: flock alone)",
                    plan.bin_dir.display(),
                    chained.name()
                )
                .into(),
            });
        }
    }
    let shim = std::fs::read(&plan.shim).map_err(|source| Error::Install {
        op: "read the shim",
        path: plan.shim.clone(),
        source: source.into(),
    })?;
    create_dir(&plan.bin_dir)?;
    create_dir(&plan.conf_dir)?;
    let shim_path = write(&plan.bin_dir, "flock", &shim, 0o755, "copy the shim to")?;
    let conflist_path = write(
        &plan.conf_dir,
        CONFLIST_NAME,
        text.as_bytes(),
        0o644,
        "write the conflist",
    )?;
    Ok(vec![shim_path, conflist_path])
}

/// The shim's own reading of the conflist: what it will refuse, refused now.
fn check_conflist(
    plan: &InstallPlan,
    text: &str,
) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if !plan.cni_version.is_supported() {
        return Err(format!(
            "cniVersion {} is not supported; flock supports {}",
            plan.cni_version,
            supported_list()
        )
        .into());
    }
    let list = Conflist::from_slice(text.as_bytes())?;
    let config = list
        .plugin_config(0, None)
        .ok_or("the conflist has no plugin")?;
    FlockNetConf::from_netconf(&NetConf::from_value(&config)?)?;
    Ok(())
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Install {
        op: "create directory",
        path: dir.to_owned(),
        source: source.into(),
    })
}

fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32, op: &'static str) -> Result<PathBuf> {
    durable::write_file(dir, name, bytes, mode).map_err(|e: DurableError| Error::Install {
        op,
        path: dir.join(name),
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_flag_takes_known_plugins_and_none() {
        assert_eq!(parse_chained("portmap"), Ok(Some(Chained::Portmap)));
        assert_eq!(parse_chained("bandwidth"), Ok(Some(Chained::Bandwidth)));
        assert_eq!(parse_chained("none"), Ok(None));
        let default: Vec<Chained> = DEFAULT_CHAIN_FLAG
            .split(',')
            .filter_map(|c| parse_chained(c).unwrap())
            .collect();
        assert_eq!(default, DEFAULT_CHAIN);
        let e = parse_chained("tuning").unwrap_err();
        assert!(
            e.contains("\"tuning\"") && e.contains("portmap, bandwidth, or none"),
            "{e}"
        );
    }

    #[test]
    fn cni_version_flag_takes_only_supported_versions() {
        assert_eq!(parse_cni_version("1.0.0"), Ok(CniVersion::V1_0_0));
        assert_eq!(parse_cni_version("0.4.0"), Ok(CniVersion::V0_4_0));
        assert_eq!(parse_cni_version("1.1.0"), Ok(CniVersion::V1_1_0));
        assert_eq!(
            parse_cni_version("0.3.1").unwrap_err(),
            "cniVersion 0.3.1 is not supported; flock supports 0.4.0, 1.0.0, 1.1.0"
        );
        assert!(parse_cni_version("1.0").unwrap_err().contains("\"1.0\""));
    }
}
