//! The handlers' typed errors, and the one place they become CNI errors: the code, a message
//! that says what to fix, and the whole cause chain — the kernel's errno and message
//! included — in `details`.

pub use flock_cni_proto::error::cause_chain;
use flock_cni_proto::{CniError, ErrorCode};

use crate::store::AttachmentKey;

/// flock's own CNI error codes (100 and up, as the spec reserves for plugins).
pub mod codes {
    /// A pod annotation is malformed or asks for something the node cannot give.
    pub const INVALID_ANNOTATION: u32 = 100;
    /// The pool has no free address left.
    pub const POOL_EXHAUSTED: u32 = 101;
    /// A fixed address is already in use.
    pub const ADDRESS_IN_USE: u32 = 102;
    /// Programming or tearing down the kernel failed.
    pub const KERNEL: u32 = 103;
    /// The allocation store could not be written.
    pub const STORE: u32 = 104;
    /// CHECK found a difference between the kernel and the record.
    pub const CHECK_MISMATCH: u32 = 105;
    /// The pod's NetworkPolicy rules could not be applied.
    pub const POLICY: u32 = 106;
}

/// Why a CNI request failed.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The request is invalid before flock looks at it (configuration, `CNI_ARGS`, container
    /// ID, interface name) or the pod could not be resolved: already a CNI error.
    #[error("{}", .0.msg)]
    Request(CniError),
    /// ADD without `CNI_NETNS`.
    #[error("ADD needs CNI_NETNS")]
    MissingNetns,
    /// No NodeConfig yet: nothing to allocate from.
    #[error("no NodeConfig for this node yet: flock cannot allocate addresses")]
    NoNodeConfig,
    /// The pod's annotations or the allocation they ask for.
    #[error(transparent)]
    Ipam(#[from] flock_ipam::Error),
    /// Every host veth name for the attachment is taken (FNV-1a collisions).
    #[error(
        "no free host interface name for container {container_id} interface {if_name}: {tried} names are owned by other attachments"
    )]
    HostIfNames {
        /// The container.
        container_id: String,
        /// Its interface.
        if_name: String,
        /// How many names were tried.
        tried: u32,
    },
    /// The kernel refused an operation.
    #[error("{op} of container {container_id} interface {if_name}")]
    Kernel {
        /// `set up`, `tear down`, `check`.
        op: &'static str,
        /// The container.
        container_id: String,
        /// Its interface.
        if_name: String,
        /// The kernel's error, errno included.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The allocation store could not be written.
    #[error("allocation store")]
    Store(#[source] crate::Error),
    /// ADD: the pod's NetworkPolicy rules are not (known to be) in place; the pod is not
    /// started without them.
    #[error("NetworkPolicy rules of pod {pod}")]
    Policy {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: crate::policy::EnforceError,
    },
    /// CHECK or a release of an attachment flock does not know.
    #[error("no allocation for container {container_id} interface {if_name}")]
    UnknownAttachment {
        /// The container.
        container_id: String,
        /// Its interface.
        if_name: String,
    },
    /// CHECK before CNI 0.4.0.
    #[error("CHECK needs cniVersion 0.4.0 or later, not {version}")]
    CheckUnsupported {
        /// The configuration's version.
        version: String,
    },
    /// CHECK: the runtime's `prevResult` is not the allocation.
    #[error("prevResult ips {got:?} differ from the allocation {want:?}")]
    PrevResultMismatch {
        /// What `prevResult` lists.
        got: Vec<String>,
        /// What flock allocated.
        want: Vec<String>,
    },
    /// CHECK: the kernel differs from the record.
    #[error("{}", mismatch_summary(.mismatches))]
    KernelMismatch {
        /// Every difference.
        mismatches: Vec<String>,
    },
    /// STATUS: the agent cannot serve ADDs.
    #[error("flock cannot serve ADD: {}{}", .reasons.join("; "), .bird.as_ref().map(|b| format!("; and BIRD is failing, so existing pods may not be announced: {b}")).unwrap_or_default())]
    NotServing {
        /// Every reason.
        reasons: Vec<String>,
        /// BIRD's problem, when it fails too (existing pods are degraded: code 51).
        bird: Option<String>,
    },
    /// GC without its list of valid attachments.
    #[error("GC needs cni.dev/valid-attachments (or cni.dev/attachments) in the config")]
    GcWithoutList,
    /// GC could not release some attachments (it went on past each).
    #[error("GC failed for {} attachment(s)", .failures.len())]
    Gc {
        /// Each attachment and why.
        failures: Vec<(AttachmentKey, HandlerError)>,
    },
}

fn mismatch_summary(all: &[String]) -> String {
    match all {
        [] => "the kernel differs from the allocation".to_owned(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
    }
}

impl From<CniError> for HandlerError {
    fn from(e: CniError) -> HandlerError {
        HandlerError::Request(e)
    }
}

impl HandlerError {
    /// The CNI error code (DESIGN §2, and flock's own [`codes`]).
    pub fn code(&self) -> ErrorCode {
        let plugin = ErrorCode::Plugin;
        match self {
            HandlerError::Request(e) => e.code,
            HandlerError::MissingNetns => ErrorCode::InvalidEnvironmentVariables,
            HandlerError::NoNodeConfig => ErrorCode::TryAgainLater,
            HandlerError::Ipam(e) => plugin(match e {
                flock_ipam::Error::Exhausted { .. } => codes::POOL_EXHAUSTED,
                flock_ipam::Error::InUse { .. } => codes::ADDRESS_IN_USE,
                _ => codes::INVALID_ANNOTATION,
            }),
            HandlerError::HostIfNames { .. } | HandlerError::Kernel { .. } => plugin(codes::KERNEL),
            HandlerError::Store(_) => plugin(codes::STORE),
            HandlerError::Policy { source, .. } => match source {
                crate::policy::EnforceError::Failed(_) => plugin(codes::POLICY),
                _ => ErrorCode::TryAgainLater,
            },
            HandlerError::UnknownAttachment { .. } => ErrorCode::UnknownContainer,
            HandlerError::CheckUnsupported { .. } => ErrorCode::IncompatibleCniVersion,
            HandlerError::PrevResultMismatch { .. } | HandlerError::KernelMismatch { .. } => {
                plugin(codes::CHECK_MISMATCH)
            }
            HandlerError::NotServing { bird: None, .. } => ErrorCode::PluginNotAvailable,
            HandlerError::NotServing { bird: Some(_), .. } => {
                ErrorCode::PluginNotAvailableLimitedConnectivity
            }
            HandlerError::GcWithoutList => ErrorCode::InvalidNetworkConfig,
            HandlerError::Gc { failures } => failures
                .first()
                .map_or(plugin(codes::KERNEL), |(_, e)| e.code()),
        }
    }

    /// The CNI error the runtime sees: `msg` names what failed, `details` carries the causes
    /// under it down to the kernel's errno (or every difference, or every failed attachment).
    pub fn to_cni(&self) -> CniError {
        let details = match self {
            HandlerError::Request(e) => e.details.clone(),
            HandlerError::KernelMismatch { mismatches } => mismatches.join("; "),
            HandlerError::Gc { failures } => failures
                .iter()
                .map(|(k, e)| format!("{} {}: {}", k.container_id, k.if_name, cause_chain(e)))
                .collect::<Vec<_>>()
                .join("; "),
            // The message says what failed; the details say why, down to the errno.
            other => std::error::Error::source(other)
                .map(cause_chain)
                .unwrap_or_default(),
        };
        CniError::new(self.code(), self.to_string()).with_details(details)
    }
}
