//! The flock node agent: RPC server, crash-safe allocation store, CNI handlers,
//! Kubernetes watchers, NetworkPolicy enforcement with nftables, BIRD writer, metrics and
//! health. (The cluster-pool controller is the crate `flock-controller`.)
//!
//! Does I/O; business rules live in the pure crates it composes (`flock-ipam`,
//! `flock-embed`, `flock-bird`, `flock-policy`, `flock-cni-proto`) and kernel work in `flock-netns`.

use std::path::PathBuf;

pub mod agent;
pub mod cache;
pub mod crd;
pub mod daemon;
pub mod inspect;
pub mod install;
pub mod k8s;
pub mod kernel;
pub mod metrics;
pub mod pods;
pub mod policy;
pub mod routing;
pub mod server;
pub mod store;
pub mod trace;

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The NodeConfig file is not valid YAML of the resource's schema.
    #[error("node config {path}: {reason}")]
    NodeConfigFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A NodeConfig or NodePool is invalid (the field, the value and why).
    #[error(transparent)]
    Api(#[from] flock_k8s_api::Error),
    /// A file the agent writes (other than the store's) could not be written.
    #[error("write {what} {path}: {op}")]
    WriteFile {
        /// What the file is (`BIRD configuration`).
        what: &'static str,
        /// The step that failed (`create directory`, `rename`, …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A store operation failed.
    #[error("allocation store: {op} {path}: {source}")]
    Store {
        /// The operation.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `install-cni` could not install the shim or the conflist.
    #[error("install-cni: {op} {path}: {source}")]
    Install {
        /// The step (`read the shim`, `create directory`, `write the conflist`, …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What failed: the I/O error, or why the shim would refuse the conflist.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A socket (the agent's, the metrics listener) could not be set up.
    #[error("{op} {path}: {source}")]
    Socket {
        /// What the agent was doing (`bind agent socket`, `create socket directory`).
        op: &'static str,
        /// The path or address.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The agent socket's directory is shared (sticky, like `/tmp`): the agent makes that
    /// directory private, so it must be one of its own.
    #[error(
        "socket directory {path} is shared (mode {mode:o}, sticky bit set): give --socket a directory of the agent's own, such as /run/flock"
    )]
    SharedSocketDir {
        /// The directory.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// A store file is unreadable: the agent refuses to start rather than start empty.
    #[error(
        "allocation store is corrupt: {path}: {reason} (fix or move the file aside; the agent will not start with an unreadable store)"
    )]
    CorruptStore {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A record could not be removed from the store.
    #[error("allocation store: {reason}")]
    StoreRecord {
        /// What went wrong.
        reason: String,
    },
    /// A Kubernetes API call or client set-up failed.
    #[error("kubernetes: {op}: {source}")]
    Kube {
        /// What the agent was doing (`load kubeconfig /path`, `patch nodeconfigs/host001/status`).
        op: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Kubernetes mode was started without something it needs.
    #[error("kubernetes mode: {reason}")]
    KubeMode {
        /// What is missing and how to give it.
        reason: String,
    },
}

/// The agent's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
