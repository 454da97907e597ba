//! Why a command could not answer, each with its own exit code, so a script tells "flock
//! found a problem" (1) from "the question was wrong" or "the answer could not be had".

/// A command that could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster's API could not be reached or refused a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being asked.
        what: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The client could not be set up (kubeconfig).
    #[error(transparent)]
    Client(#[from] flock_k8s_api::client::ClientError),
    /// Something asked for does not exist: a pod, a node.
    #[error("{asked}: {found}")]
    NotFound {
        /// What was asked (`pod default/web-1`, `node node9`).
        asked: String,
        /// What was found instead.
        found: String,
    },
    /// The cluster does not run flock.
    #[error("no flock here: {found}")]
    NoFlock {
        /// What was looked for and not found.
        found: String,
    },
    /// A node's agent did not answer (or answered what cannot be read).
    #[error("node {node}: the agent did not answer: {reason}")]
    Agent {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// An argument that does not read.
    #[error("{field} {value:?}: {reason}")]
    Usage {
        /// The argument.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `ipam check --release` refused, because a source it needs could not be read.
    #[error("nothing released: {reason}")]
    Refused {
        /// Why.
        reason: String,
    },
}

/// The exit code of a command that answered and found a problem.
pub const EXIT_PROBLEM: u8 = 1;

impl Error {
    /// The exit code: 2 a wrong argument (as clap's own), 3 not found, 4 no flock in the
    /// cluster, 5 an agent did not answer or a release was refused for want of a source,
    /// 6 the API or the kubeconfig, 7 a local file.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage { .. } => 2,
            Error::NotFound { .. } => 3,
            Error::NoFlock { .. } => 4,
            Error::Agent { .. } | Error::Refused { .. } => 5,
            Error::Api { .. } | Error::Client(_) => 6,
            Error::Io { .. } => 7,
        }
    }
}

/// A command's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
