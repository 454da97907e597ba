//! Applying a script: `nft -f -` in the node's namespace ([`NftCommand`]), or in memory for
//! the tests ([`MemoryNft`]). One script is one nftables transaction: all of it or nothing.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use flock_netns::NsTarget;

use crate::pods::BoxFuture;

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
    /// The test double was told to fail.
    #[error("injected failure: {0}")]
    Injected(String),
}

/// Applies nftables scripts.
pub trait Nft: Send + Sync + 'static {
    /// Applies `script` as one transaction.
    fn apply(&self, script: String) -> BoxFuture<'_, Result<(), NftError>>;
}

/// The real one: runs `nft -f -` with the script on stdin, in the node's namespace.
#[derive(Debug, Clone)]
pub struct NftCommand {
    program: PathBuf,
    netns: NsTarget,
}

impl NftCommand {
    /// `program` (normally `nft`) in `netns` (the agent's own in production).
    pub fn new(program: impl Into<PathBuf>, netns: NsTarget) -> NftCommand {
        NftCommand {
            program: program.into(),
            netns,
        }
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
