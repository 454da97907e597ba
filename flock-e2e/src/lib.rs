//! End-to-end harness: containerd's CRI plugin as a real CNI client (containerd 2, the test
//! bed's build, first on `PATH` under `cargo xtask test`; 1.6 and 1.7 work too).
//!
//! Does I/O (processes, files, gRPC); test support only, never shipped.
//!
//! - [`PauseImage`]: a tiny sandbox image (busybox-static `sleep`) packed as
//!   an OCI archive in Rust and imported with `ctr images import`.
//! - [`ContainerdConfig`] / [`Containerd`]: containerd started inside a
//!   stand-in node namespace with its own root, state and socket in a temp
//!   dir, in a private mount namespace so every mount it makes dies with it;
//!   killed with its shims and sandboxes on drop, also on panic.
//! - [`CriClient`]: CRI v1 over tonic on the Unix socket — RunPodSandbox,
//!   PodSandboxStatus (netns path and IPs), StopPodSandbox, RemovePodSandbox.
//! - [`E2eNode`]: all of the above for any conflist, or a CNI conf dir an
//!   installer filled ([`NodeSetup::installed`]), and CNI bin dir, with a hook
//!   that runs before containerd starts.

// The crate's docs name the CRI harness, which is not there without `cri`.
#![cfg_attr(not(feature = "cri"), allow(rustdoc::broken_intra_doc_links))]

mod config;
#[cfg(feature = "cri")]
mod containerd;
#[cfg(feature = "cri")]
mod cri;
mod image;
#[cfg(feature = "cri")]
mod node;
mod tar;

pub use config::{ContainerdConfig, Snapshotter};
#[cfg(feature = "cri")]
pub use containerd::{Containerd, shim_socket};
#[cfg(feature = "cri")]
pub use cri::{CriClient, PodSandboxSpec, RunConditions, SandboxNetwork, SandboxRun};
pub use image::{OciDocuments, PauseImage, oci_arch, oci_archive, oci_documents, sha256_digest};
#[cfg(feature = "cri")]
pub use node::{BeforeStart, CniConf, E2eNode, NodeSetup};
pub use tar::TarBuilder;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the harness can fail at; each message names the operation and
/// the value so a failing end-to-end test says what to look at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`write containerd config`, `read busybox`).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A program could not be started.
    #[error("spawn {program}: {source}")]
    Spawn {
        /// The program and its arguments.
        program: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it wrote on stderr (and stdout), trimmed.
        stderr: String,
    },
    /// containerd exited while the harness waited for it.
    #[error("containerd exited during start ({status}); last lines of {log}:\n{tail}")]
    ContainerdExited {
        /// Its exit status.
        status: String,
        /// The log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// Something did not become ready in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What the harness waited for.
        what: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The gRPC channel to the CRI socket could not be opened.
    #[cfg(feature = "cri")]
    #[error("connect to CRI socket {socket}: {source}")]
    Connect {
        /// The containerd socket.
        socket: PathBuf,
        /// The underlying error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A CRI call returned an error.
    #[cfg(feature = "cri")]
    #[error("CRI {rpc} for {target}: {source}")]
    Rpc {
        /// The RPC (`RunPodSandbox`).
        rpc: &'static str,
        /// The pod or sandbox it was about.
        target: String,
        /// The status containerd answered with.
        #[source]
        source: Box<tonic::Status>,
    },
    /// A CRI answer lacked what the harness needs from it.
    #[error("CRI {rpc} for {target}: {reason}")]
    BadAnswer {
        /// The RPC.
        rpc: &'static str,
        /// The pod or sandbox it was about.
        target: String,
        /// What was missing or malformed.
        reason: String,
    },
    /// JSON could not be encoded or decoded.
    #[error("{what}: {source}")]
    Json {
        /// The document.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// The hook that runs before containerd failed.
    #[error("before-start hook: {source}")]
    BeforeStart {
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `cmd`, returning its stdout, or [`Error::CommandFailed`] with its
/// stderr when it exits non-zero.
pub(crate) fn run_checked(cmd: &mut std::process::Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| Error::Spawn {
        program: shown.clone(),
        source,
    })?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !stdout.trim().is_empty() {
            text.push_str(" / stdout: ");
            text.push_str(stdout.trim());
        }
        return Err(Error::CommandFailed {
            command: shown,
            status: out.status.to_string(),
            stderr: text,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The README's examples, compiled (and the pure one run) as doctests.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "cri"))]
pub struct ReadmeDoctests;

/// The folder of the containerd to run (`containerd`, `ctr`, `containerd-shim-runc-v2`), when
/// not the one on `PATH`: the test bed's build of containerd 2.
pub const CONTAINERD_DIR_ENV: &str = "FLOCK_CONTAINERD_DIR";

/// The folder of a containerd 1.7 (`containerd`, `ctr`, `containerd-shim-runc-v2`): the test
/// bed's build, for the test that keeps flock's installed conflist working on it.
pub const CONTAINERD_1_7_DIR_ENV: &str = "FLOCK_CONTAINERD_1_7_DIR";

/// The folder [`CONTAINERD_1_7_DIR_ENV`] names; panics, saying how to get one, when it is
/// unset or holds no containerd 1.7.
#[cfg(feature = "cri")]
pub fn containerd_1_7_dir() -> PathBuf {
    let dir = std::env::var_os(CONTAINERD_1_7_DIR_ENV).map(PathBuf::from);
    let major = dir
        .as_ref()
        .and_then(|d| containerd::major_version(&d.join("containerd")).ok());
    assert_eq!(
        major,
        Some(1),
        "{CONTAINERD_1_7_DIR_ENV}={dir:?} names no containerd 1.x: `cargo xtask test` builds \
         containerd 1.7 into /var/cache/flock and sets it"
    );
    dir.expect("checked")
}

/// `containerd` or `ctr`: from [`CONTAINERD_DIR_ENV`] when set, else from `PATH`.
pub fn program(name: &str) -> PathBuf {
    match std::env::var_os(CONTAINERD_DIR_ENV) {
        Some(dir) => Path::new(&dir).join(name),
        None => PathBuf::from(name),
    }
}

/// Panics, saying what to install, unless this runs as root and has what the containerd tests
/// drive: busybox-static (the pause image), the reference CNI plugins, containerd (from
/// [`CONTAINERD_DIR_ENV`] or `PATH`) and runc (from `PATH`). `cargo xtask test` installs and
/// builds them, and puts the test bed's containerd 2 and runc first on `PATH`.
#[cfg(feature = "cri")]
pub fn require_tools() {
    flock_testkit::require_root();
    for tool in [
        PathBuf::from("/bin/busybox"),
        flock_testkit::reference_plugins_dir().join("ptp"),
    ] {
        assert!(
            tool.exists(),
            "{} missing: `cargo xtask test` installs busybox-static and builds the reference plugins",
            tool.display()
        );
    }
    for program in [program("containerd"), program("ctr"), PathBuf::from("runc")] {
        let runs = std::process::Command::new(&program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            runs,
            "{} does not run: `cargo xtask test` builds containerd 2 and runc and puts them on PATH",
            program.display()
        );
    }
}
