//! The BIRD writer: renders the configuration (through a caller-supplied renderer built on
//! `flock-bird`), writes it atomically only when its bytes changed, and reloads BIRD with
//! `birdc -s SOCK configure`. Changes are debounced so a burst of pod changes becomes one
//! reload; a failing or absent BIRD is reported in health and metrics and retried, and never
//! stops pods from being served.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::watch;
use tokio::time::Instant;

use super::BirdError;
use crate::metrics::{Component, Health, Metrics};

/// Where and how to reach BIRD.
#[derive(Clone, Debug)]
pub struct BirdTarget {
    /// The configuration file BIRD reads (`--bird-config`).
    pub config_path: PathBuf,
    /// BIRD's control socket (`--bird-socket`).
    pub socket: PathBuf,
    /// The `birdc` program (`--birdc`).
    pub birdc: PathBuf,
}

/// Debounce timing.
#[derive(Clone, Copy, Debug)]
pub struct Debounce {
    /// Quiet time after the last change before rendering.
    pub quiet: Duration,
    /// The longest a change waits, however busy the stream of changes.
    pub max_delay: Duration,
    /// Retry interval after a failed reload.
    pub retry: Duration,
}

impl Default for Debounce {
    fn default() -> Self {
        Debounce {
            quiet: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            retry: Duration::from_secs(5),
        }
    }
}

/// Renders the configuration from the agent's current state: `Ok(None)` when the node has no
/// BGP, `Err` with a reason when the model does not validate.
pub type Renderer = Arc<dyn Fn() -> Result<Option<String>, BirdError> + Send + Sync>;

/// Handle to mark BIRD's configuration as possibly changed.
#[derive(Clone, Debug)]
pub struct BirdHandle {
    tx: watch::Sender<u64>,
}

impl BirdHandle {
    /// Something BIRD announces may have changed: re-render soon.
    pub fn refresh(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Starts the writer task; it renders once at start and then after every debounced change.
pub fn spawn(
    target: BirdTarget,
    render: Renderer,
    debounce: Debounce,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> BirdHandle {
    let (tx, mut rx) = watch::channel(0u64);
    tokio::spawn(async move {
        let mut last_ok = false;
        loop {
            let outcome = sync_once(&target, &render, last_ok).await;
            match outcome {
                Ok(SyncOutcome::Reloaded) => {
                    metrics.bird_reloads.inc();
                    health.set_problem(Component::Bird, None);
                    last_ok = true;
                }
                Ok(SyncOutcome::Unchanged) => {
                    last_ok = true;
                }
                Ok(SyncOutcome::NoBgp) => {
                    // Without BGP there is nothing for BIRD to do: an earlier failure is no
                    // longer a problem of this node.
                    health.set_problem(Component::Bird, None);
                    last_ok = true;
                }
                Err(e) => {
                    let problem = flock_cni_proto::error::cause_chain(&e);
                    tracing::warn!(%problem, "BIRD reload failed");
                    metrics.bird_failures.inc();
                    health.set_problem(Component::Bird, Some(problem));
                    last_ok = false;
                }
            }
            // Wait for the next change (or, after a failure, the retry interval).
            let changed = if last_ok {
                rx.changed().await.is_ok()
            } else {
                tokio::select! {
                    r = rx.changed() => r.is_ok(),
                    _ = tokio::time::sleep(debounce.retry) => true,
                }
            };
            if !changed {
                return; // every handle dropped: the agent is shutting down
            }
            rx.mark_unchanged();
            let first = Instant::now();
            loop {
                let deadline = (Instant::now() + debounce.quiet).min(first + debounce.max_delay);
                tokio::select! {
                    r = rx.changed() => {
                        if r.is_err() { break; }
                        rx.mark_unchanged();
                        if Instant::now() >= first + debounce.max_delay { break; }
                    }
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
        }
    });
    BirdHandle { tx }
}

enum SyncOutcome {
    Reloaded,
    Unchanged,
    NoBgp,
}

async fn sync_once(
    target: &BirdTarget,
    render: &Renderer,
    last_ok: bool,
) -> Result<SyncOutcome, BirdError> {
    let Some(config) = render()? else {
        return Ok(SyncOutcome::NoBgp);
    };
    let current = tokio::fs::read(&target.config_path).await.ok();
    let changed = current.as_deref() != Some(config.as_bytes());
    if !changed && last_ok {
        return Ok(SyncOutcome::Unchanged);
    }
    if changed {
        write_config(&target.config_path, config.as_bytes()).await?;
    }
    configure(target).await?;
    Ok(SyncOutcome::Reloaded)
}

async fn write_config(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    let path = path.to_owned();
    let bytes = bytes.to_owned();
    tokio::task::spawn_blocking(move || {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|source| crate::Error::WriteFile {
            what: "BIRD configuration",
            op: "create directory",
            path: dir.to_owned(),
            source,
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bird.conf".into());
        flock_rpc::durable::write_file(dir, &name, &bytes, 0o644)
            .map(drop)
            .map_err(|e| crate::Error::WriteFile {
                what: "BIRD configuration",
                op: e.op,
                path: e.path,
                source: e.source,
            })
    })
    .await
    .expect("config writer task panicked")
}

/// Runs `birdc -s SOCK configure` and interprets BIRD's reply.
pub async fn configure(target: &BirdTarget) -> Result<(), BirdError> {
    let out = target.birdc(&["configure"]).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let accepted = stdout.contains("Reconfigured")
        || stdout.contains("Reconfiguration in progress")
        || stdout.contains("Reconfiguration already in progress");
    if out.status.success() && accepted {
        Ok(())
    } else {
        Err(target.refused("configure", &out))
    }
}

impl BirdTarget {
    /// Runs `birdc -s SOCK ARGS…`.
    pub(super) async fn birdc(&self, args: &[&str]) -> Result<std::process::Output, BirdError> {
        Command::new(&self.birdc)
            .arg("-s")
            .arg(&self.socket)
            .args(args)
            .output()
            .await
            .map_err(|source| BirdError::Run {
                program: self.birdc.clone(),
                source,
            })
    }

    /// `command` was refused: what birdc printed.
    pub(super) fn refused(&self, command: &'static str, out: &std::process::Output) -> BirdError {
        BirdError::Refused {
            program: self.birdc.clone(),
            socket: self.socket.clone(),
            command,
            reply: [&out.stdout, &out.stderr]
                .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                .into_iter()
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_testkit::wait::eventually;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_bird_problem_is_cleared_once_bgp_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let bgp = Arc::new(AtomicBool::new(true));
        let render: Renderer = {
            let bgp = bgp.clone();
            Arc::new(move || {
                Ok(bgp
                    .load(Ordering::SeqCst)
                    .then(|| "router id 1.1.1.1;\n".into()))
            })
        };
        let health = Arc::new(Health::default());
        let handle = spawn(
            BirdTarget {
                config_path: dir.path().join("bird.conf"),
                socket: dir.path().join("bird.ctl"),
                // `birdc` that always fails: BIRD is down.
                birdc: "false".into(),
            },
            render,
            Debounce {
                quiet: Duration::from_millis(5),
                max_delay: Duration::from_millis(20),
                retry: Duration::from_millis(50),
            },
            Arc::new(Metrics::new()),
            health.clone(),
        );
        eventually("BIRD's failure is reported", || {
            health.problem(Component::Bird).is_some()
        })
        .await;
        bgp.store(false, Ordering::SeqCst);
        handle.refresh();
        eventually("the problem is cleared without BGP", || {
            health.problem(Component::Bird).is_none()
        })
        .await;
    }
}
