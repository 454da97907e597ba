//! Everything that can go wrong in the pool controller.

/// An error of the pool controller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kubernetes API call or the client's set-up failed.
    #[error("kubernetes: {op}: {source}")]
    Kube {
        /// What the controller was doing (`create nodeconfigs/host001`, `renew the Lease`).
        op: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Started without an identity for the Lease.
    #[error(
        "the controller's identity is required: pass --identity or set FLOCK_POD_NAME (the \
         Deployment sets it from metadata.name)"
    )]
    NoIdentity,
    /// A watch ended before its first listing.
    #[error("the watch of {what} stopped before its first listing")]
    WatchStopped {
        /// The watched kind (`Nodes`, `NodePools`, …).
        what: &'static str,
    },
    /// The Lease is no longer this instance's: it stops writing and ends, to restart as a
    /// candidate.
    #[error("the controller lost its lease; {then}")]
    LostLease {
        /// What it does about it (`stopping before another write`).
        then: &'static str,
    },
}

/// The controller's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a kube error into [`Error::Kube`] naming `op`.
pub(crate) fn kube_err<E>(op: String) -> impl FnOnce(E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| Error::Kube {
        op,
        source: Box::new(e),
    }
}

impl From<flock_k8s_api::client::ClientError> for Error {
    fn from(e: flock_k8s_api::client::ClientError) -> Self {
        Error::Kube {
            op: e.op,
            source: e.source,
        }
    }
}
