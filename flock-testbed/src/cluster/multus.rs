//! Multus, thick plugin, as the cluster's meta-plugin with flock behind it: built from its Go
//! module ([`crate::components::multus`]), its image made here ([`images::build_multus_image`]),
//! and deployed with its project's own manifest (`deployments/multus-daemonset-thick.yml` of
//! the same module: the NetworkAttachmentDefinition CRD, its RBAC, its daemon's
//! configuration and DaemonSet), only the image reference and the daemon's socket folder
//! changed ([`manifest`]). Its installer puts the
//! shim in each node's `/opt/cni/bin` and its daemon writes `00-multus.conf` in front of
//! flock's conflist, with flock's network as the cluster network it delegates to.
//!
//! [`install`] makes the running cluster a Multus cluster (`cargo xtask cluster up --multus`,
//! and `life multus` for its test); [`uninstall`] makes it a plain flock cluster again: its
//! objects deleted, its configuration and shim removed from the nodes, so the runtime calls
//! flock directly again.

use std::time::Duration;

use anyhow::{Context, Result};

use super::{NODES, images, kube, kubectl, kubectl_stdin, node};
use crate::components;
use crate::sys;

/// The image reference in Multus's manifest.
const UPSTREAM_IMAGE: &str = "ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot-thick";
/// The configuration Multus's daemon writes in front of the cluster network's.
pub const MULTUS_CONF: &str = "00-multus.conf";
/// Multus's DaemonSet.
const DAEMONSET: &str = "daemonset/kube-multus-ds";

/// The image made here, under the name of Multus's release image.
pub fn image() -> String {
    format!(
        "ghcr.io/k8snetworkplumbingwg/multus-cni:v{}-thick",
        crate::versions::MULTUS
    )
}

/// The daemon's socket folder in Multus's manifest (the container's view of the node's
/// `/run/multus`).
const UPSTREAM_SOCKET_DIR: &str = "\"socketDir\": \"/host/run/multus/\"";
/// Where the test bed's daemons put their socket instead: a folder inside the node's own
/// `/run/multus`, and the same place as the shim on the node sees it.
const SOCKET_DIR: &str = "\"socketDir\": \"/host/run/multus/daemon/\",\n        \"daemonSocketDir\": \"/run/multus/daemon/\"";

/// Multus's thick deployment manifest from its module, on [`image`], with one change for two
/// nodes on one machine: each node's `/run/multus` is a mount of its own here, which the
/// daemon cannot remove and make again as it does its socket folder at start (`device or
/// resource busy`), so the socket goes in a folder inside it, and the daemon's configuration
/// tells the shim where (`daemonSocketDir`, which the daemon copies into `00-multus.conf`).
pub fn manifest() -> Result<String> {
    let source = components::multus().source_dir()?;
    let path = source.join("deployments/multus-daemonset-thick.yml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    super::deploy::edited(
        &path,
        &text,
        &[
            (UPSTREAM_IMAGE.to_owned(), image()),
            (UPSTREAM_SOCKET_DIR.to_owned(), SOCKET_DIR.to_owned()),
        ],
    )
}

/// Whether Multus is deployed (its DaemonSet exists).
pub fn installed() -> bool {
    kubectl(&["-n", "kube-system", "get", DAEMONSET, "-o", "name"]).is_ok()
}

/// Deploys Multus and waits until every node's runtime calls it: the DaemonSet rolled out
/// and its configuration in front of flock's on every node.
pub fn install() -> Result<()> {
    let multus = components::multus().ensure_built()?;
    let archive = images::build_multus_image(&multus, &image())?;
    let kube = kube::ensure_built()?;
    for n in &NODES {
        images::import(&kube, &node::containerd_socket(n), &archive)
            .with_context(|| format!("import Multus's image on {}", n.name))?;
    }
    kubectl_stdin(&["apply", "-f", "-"], &manifest()?)?;
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        DAEMONSET,
        "--timeout=180s",
    ])
    .context("wait for Multus's daemons")?;
    for n in &NODES {
        let conf = node::host_path(n, "/etc/cni/net.d")
            .context("the nodes' CNI configuration folder")?
            .join(MULTUS_CONF);
        sys::wait_for(Duration::from_secs(60), || conf.exists())
            .with_context(|| format!("Multus wrote no {} on {}", conf.display(), n.name))?;
    }
    Ok(())
}

/// Removes Multus: its objects (the CRD with every NetworkAttachmentDefinition), then its
/// configuration and shim on each node, so that the runtime calls flock again.
pub fn uninstall() -> Result<()> {
    kubectl_stdin(
        &["delete", "--ignore-not-found", "--wait=true", "-f", "-"],
        &manifest()?,
    )?;
    for n in &NODES {
        for (dir, file) in [
            ("/etc/cni/net.d", MULTUS_CONF),
            ("/opt/cni/bin", "multus-shim"),
            ("/opt/cni/bin", "passthru"),
        ] {
            let path = node::host_path(n, dir)
                .with_context(|| format!("{}'s {dir}", n.name))?
                .join(file);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("remove {}", path.display())),
            }
        }
        let dir = node::host_path(n, "/etc/cni/net.d").context("CNI folder")?;
        // the daemon keeps its kubeconfig and whereabouts in multus.d
        let _ = std::fs::remove_dir_all(dir.join("multus.d"));
    }
    Ok(())
}
