//! Everything the node tells its BGP neighbors, in one place: what it announces (its pod
//! CIDRs, anycast and Service addresses: [`announce`], [`services`]), the BIRD configuration
//! written from it and BIRD's reloads ([`bird`]), and what BIRD says of the sessions
//! ([`sessions`]). The Kubernetes watches that feed the Service caches are in
//! [`crate::k8s::services`]; the NodeConfig status reports the sessions
//! ([`crate::k8s::node_status`]).

pub mod announce;
pub mod bird;
pub mod services;
pub mod sessions;

/// Why talking to BIRD or rendering its configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    /// The announcement model is not valid (names the field and value).
    #[error("BIRD configuration model: {0}")]
    Model(#[source] Box<flock_bird::Error>),
    /// The configuration file could not be written.
    #[error(transparent)]
    Write(#[from] crate::Error),
    /// `birdc` could not be run.
    #[error("run {program}: {source}")]
    Run {
        /// The program.
        program: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// BIRD refused the command or could not be reached through its socket.
    #[error("{} -s {} {command}: {reply}", .program.display(), .socket.display())]
    Refused {
        /// `birdc`.
        program: std::path::PathBuf,
        /// BIRD's control socket.
        socket: std::path::PathBuf,
        /// `configure`, `show protocols`.
        command: &'static str,
        /// What birdc printed.
        reply: String,
    },
    /// BIRD's reply could not be read (the error names the command).
    #[error("{} -s {}: {source}", .program.display(), .socket.display())]
    Reply {
        /// `birdc`.
        program: std::path::PathBuf,
        /// BIRD's control socket.
        socket: std::path::PathBuf,
        /// The command.
        command: &'static str,
        /// What is wrong with it.
        #[source]
        source: Box<flock_bird::Error>,
    },
}
