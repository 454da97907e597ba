//! Applying a script: `nft -f -` in the node's namespace ([`NftCommand`]), or in memory for
//! the tests ([`MemoryNft`]). One script is one nftables transaction: all of it or nothing.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use flock_netns::NsTarget;
use flock_policy::{ElementOp, Update};

use super::netlink::{ElementSocket, MAX_BATCH_ELEMENTS};

use futures::future::BoxFuture;

/// Why a script was not applied.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be run (not installed, namespace gone).
    #[error("run {program} -f - in {netns}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The namespace, as `NsTarget` describes it.
        netns: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `nft` refused the script; nothing of it was applied.
    #[error("{program} -f - in {netns} exited with {status}: {stderr}")]
    Refused {
        /// The program.
        program: PathBuf,
        /// The namespace.
        netns: String,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// nf_tables refused an element batch (sent over netlink); nothing of it was applied.
    #[error("nf_tables element batch in {netns} ({ops} elements): {source}")]
    Elements {
        /// The namespace.
        netns: String,
        /// How many elements the batch held.
        ops: usize,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The test double was told to fail.
    #[error("injected failure: {0}")]
    Injected(String),
}

/// Applies nftables scripts.
pub trait Nft: Send + Sync + 'static {
    /// Applies `script` as one transaction.
    fn apply(&self, script: String) -> BoxFuture<'_, Result<(), NftError>>;

    /// Adds and deletes set and map elements of flock's table as one transaction (deletes
    /// first, in order). By default as the `nft -f` script that says the same.
    fn apply_elements(&self, ops: Vec<ElementOp>) -> BoxFuture<'_, Result<(), NftError>> {
        let script = Update {
            elements: ops,
            ..Update::default()
        }
        .script();
        self.apply(script)
    }
}

/// The real one: runs `nft -f -` with the script on stdin, in the node's namespace; element
/// changes go over a netlink socket opened there once (see [`super::netlink`]).
#[derive(Debug, Clone)]
pub struct NftCommand {
    program: PathBuf,
    netns: NsTarget,
    socket: Arc<Mutex<Option<ElementSocket>>>,
}

impl NftCommand {
    /// `program` (normally `nft`) in `netns` (the agent's own in production).
    pub fn new(program: impl Into<PathBuf>, netns: NsTarget) -> NftCommand {
        NftCommand {
            program: program.into(),
            netns,
            socket: Arc::default(),
        }
    }

    /// Applies element changes over the kept socket, opening it (in the node's namespace)
    /// first if needed. A socket that failed is dropped: the next call opens a new one.
    async fn send_elements(&self, ops: Vec<ElementOp>) -> Result<(), NftError> {
        let error = |source: std::io::Error| NftError::Elements {
            netns: self.netns.describe(),
            ops: ops.len(),
            source,
        };
        let mut socket = self.socket.lock().expect("nft socket lock").take();
        if socket.is_none() {
            socket = Some(match &self.netns {
                NsTarget::Current => ElementSocket::open().map_err(error)?,
                NsTarget::Path(path) => flock_netns::blocking_in_netns(path, ElementSocket::open)
                    .await
                    .map_err(|e| error(std::io::Error::other(e.to_string())))?
                    .map_err(error)?,
            });
        }
        let Some(mut socket) = socket else {
            return Ok(());
        };
        let result = socket.apply(&ops).map_err(error);
        if result.is_ok() {
            *self.socket.lock().expect("nft socket lock") = Some(socket);
        }
        result
    }

    /// Runs `nft` on the calling thread, in the calling thread's namespace: private, so
    /// nothing can run it in the wrong one ([`Nft::apply`] calls it where `netns` says).
    fn run_here(&self, script: &str) -> Result<(), NftError> {
        let spawn_error = |source| NftError::Spawn {
            program: self.program.clone(),
            netns: self.netns.describe(),
            source,
        };
        let mut child = Command::new(&self.program)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error (nft exited early) shows in its status and stderr below.
            let _ = stdin.write_all(script.as_bytes());
        }
        let out = child.wait_with_output().map_err(spawn_error)?;
        if out.status.success() {
            return Ok(());
        }
        Err(NftError::Refused {
            program: self.program.clone(),
            netns: self.netns.describe(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

impl Nft for NftCommand {
    fn apply(&self, script: String) -> BoxFuture<'_, Result<(), NftError>> {
        let this = self.clone();
        Box::pin(async move {
            let thread_error = |source: std::io::Error| NftError::Spawn {
                program: self.program.clone(),
                netns: self.netns.describe(),
                source,
            };
            match &self.netns {
                // Off the tokio workers: nft takes milliseconds, a full table much longer.
                NsTarget::Current => tokio::task::spawn_blocking(move || this.run_here(&script))
                    .await
                    .map_err(|e| thread_error(std::io::Error::other(e.to_string())))?,
                // flock-netns enters the namespace on a thread of its own; nft inherits it.
                NsTarget::Path(path) => {
                    flock_netns::blocking_in_netns(path, move || this.run_here(&script))
                        .await
                        .map_err(|e| thread_error(std::io::Error::other(e.to_string())))?
                }
            }
        })
    }

    fn apply_elements(&self, ops: Vec<ElementOp>) -> BoxFuture<'_, Result<(), NftError>> {
        Box::pin(async move {
            if ops.len() > MAX_BATCH_ELEMENTS {
                let script = Update {
                    elements: ops,
                    ..Update::default()
                }
                .script();
                return self.apply(script).await;
            }
            self.send_elements(ops).await
        })
    }
}

/// Scripts kept in memory, for tests; can be told to refuse the next ones.
#[derive(Debug, Default)]
pub struct MemoryNft {
    applied: Mutex<Vec<String>>,
    fail_next: Mutex<usize>,
}

impl MemoryNft {
    /// Every script applied, in order.
    pub fn scripts(&self) -> Vec<String> {
        self.applied.lock().expect("nft lock").clone()
    }

    /// Refuses the next `n` scripts.
    pub fn fail_next(&self, n: usize) {
        *self.fail_next.lock().expect("nft lock") = n;
    }
}

impl Nft for MemoryNft {
    fn apply(&self, script: String) -> BoxFuture<'_, Result<(), NftError>> {
        Box::pin(async move {
            {
                let mut fail = self.fail_next.lock().expect("nft lock");
                if *fail > 0 {
                    *fail -= 1;
                    return Err(NftError::Injected("nft refused the script".into()));
                }
            }
            self.applied.lock().expect("nft lock").push(script);
            Ok(())
        })
    }
}
