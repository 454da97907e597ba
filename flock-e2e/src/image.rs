//! The sandbox ("pause") image, built locally: there is no registry here.
//!
//! One layer holds busybox-static and `sleep` as a link to it; the entry
//! point sleeps for ever (containerd 1.6 stops a sandbox with SIGKILL). The
//! layer, config, manifest and index are written as an OCI image layout in a
//! tar, then imported into containerd's `k8s.io` namespace with `ctr`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::tar::TarBuilder;
use crate::{Error, Result, run_checked};

/// Where Debian's busybox-static puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";

const MT_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MT_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MT_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// A locally built pause image, packed as an OCI archive.
#[derive(Debug, Clone)]
pub struct PauseImage {
    /// The reference containerd knows it by, and `sandbox_image` names.
    pub name: String,
    /// The OCI archive on disk.
    pub archive: PathBuf,
}

/// The JSON documents of a one-layer OCI image, as written to the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciDocuments {
    /// The image config (`application/vnd.oci.image.config.v1+json`).
    pub config: String,
    /// The manifest pointing at config and layer.
    pub manifest: String,
    /// `index.json`, naming the image for `ctr images import`.
    pub index: String,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The Go architecture name of the machine (`amd64`, `arm64`).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Renders config, manifest and index for an image `name` whose single
/// uncompressed layer has `layer_digest` and `layer_size`, running
/// `entrypoint` on `arch`. Pure, so it is snapshot-tested.
pub fn oci_documents(
    name: &str,
    arch: &str,
    entrypoint: &[&str],
    layer_digest: &str,
    layer_size: u64,
) -> OciDocuments {
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "WorkingDir": "/",
            "Env": ["PATH=/bin"],
        },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    })
    .to_string();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {
            "mediaType": MT_CONFIG,
            "digest": sha256_digest(config.as_bytes()),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": MT_LAYER,
            "digest": layer_digest,
            "size": layer_size,
        }],
    })
    .to_string();
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [{
            "mediaType": MT_MANIFEST,
            "digest": sha256_digest(manifest.as_bytes()),
            "size": manifest.len(),
            "platform": { "architecture": arch, "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })
    .to_string();
    OciDocuments {
        config,
        manifest,
        index,
    }
}

/// An OCI image archive (what `ctr images import` takes) of one layer: the image `name`
/// running `entrypoint`, for this machine's architecture.
pub fn oci_archive(name: &str, entrypoint: &[&str], layer: &[u8]) -> Vec<u8> {
    let layer_digest = sha256_digest(layer);
    let docs = oci_documents(
        name,
        oci_arch(),
        entrypoint,
        &layer_digest,
        layer.len() as u64,
    );
    let blob = |digest: &str| format!("blobs/sha256/{}", &digest["sha256:".len()..]);
    let mut t = TarBuilder::new();
    t.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
    t.file("index.json", 0o644, docs.index.as_bytes());
    t.dir("blobs", 0o755).dir("blobs/sha256", 0o755);
    t.file(&blob(&layer_digest), 0o644, layer);
    for doc in [&docs.config, &docs.manifest] {
        t.file(&blob(&sha256_digest(doc.as_bytes())), 0o644, doc.as_bytes());
    }
    t.finish()
}

/// The image's only layer: busybox and the directories runc mounts over.
fn pause_layer(busybox: &[u8]) -> Vec<u8> {
    let mut t = TarBuilder::new();
    for dir in ["bin", "dev", "etc", "proc", "sys"] {
        t.dir(dir, 0o755);
    }
    t.dir("tmp", 0o1777);
    t.file("bin/busybox", 0o755, busybox);
    t.symlink("bin/sleep", "busybox");
    t.symlink("bin/sh", "busybox");
    t.file("etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n");
    t.file("etc/group", 0o644, b"root:x:0:\n");
    t.finish()
}

impl PauseImage {
    /// The entry point: sleep for ever (busybox `sleep` takes seconds).
    pub const ENTRYPOINT: [&'static str; 2] = ["/bin/sleep", "2147483647"];

    /// Packs the image `name` (a full reference, e.g.
    /// `flock.test/pause:e2e`) from the machine's busybox-static into
    /// `dir/pause.oci.tar`.
    pub fn build(name: &str, dir: &Path) -> Result<PauseImage> {
        let busybox = std::fs::read(BUSYBOX).map_err(|source| Error::Io {
            op: "read busybox-static (apt-get install busybox-static)",
            path: BUSYBOX.into(),
            source,
        })?;
        let archive_bytes = oci_archive(name, &Self::ENTRYPOINT, &pause_layer(&busybox));
        let archive = dir.join("pause.oci.tar");
        std::fs::write(&archive, archive_bytes).map_err(|source| Error::Io {
            op: "write pause image archive",
            path: archive.clone(),
            source,
        })?;
        Ok(PauseImage {
            name: name.to_owned(),
            archive,
        })
    }

    /// Imports the archive into containerd's `k8s.io` namespace (where the
    /// CRI plugin looks) with `ctr` through `socket`, unpacked for `snapshotter`.
    pub fn import(&self, ctr: &Path, socket: &Path, snapshotter: &str) -> Result<()> {
        run_checked(
            Command::new(ctr)
                .arg("--address")
                .arg(socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .args(["--snapshotter", snapshotter])
                .arg(&self.archive),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_snapshot() {
        let layer = sha256_digest(b"layer");
        let docs = oci_documents(
            "flock.test/pause:e2e",
            "amd64",
            &PauseImage::ENTRYPOINT,
            &layer,
            1536,
        );
        let pretty = |s: &str| {
            serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(s).unwrap())
                .unwrap()
        };
        insta::assert_snapshot!("config", pretty(&docs.config));
        insta::assert_snapshot!("manifest", pretty(&docs.manifest));
        insta::assert_snapshot!("index", pretty(&docs.index));
    }

    #[test]
    fn manifest_points_at_config_and_index_at_manifest() {
        let docs = oci_documents("x.test/p:1", "arm64", &["/bin/sleep"], "sha256:00", 3);
        let manifest: serde_json::Value = serde_json::from_str(&docs.manifest).unwrap();
        let index: serde_json::Value = serde_json::from_str(&docs.index).unwrap();
        assert_eq!(
            manifest["config"]["digest"],
            sha256_digest(docs.config.as_bytes())
        );
        assert_eq!(manifest["config"]["size"], docs.config.len());
        assert_eq!(
            index["manifests"][0]["digest"],
            sha256_digest(docs.manifest.as_bytes())
        );
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "1"
        );
    }

    #[test]
    fn sha256_of_empty_input() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
