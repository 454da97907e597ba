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

use crate::metrics::{Health, Metrics};
use crate::store::write_durably;

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
pub type Renderer = Arc<dyn Fn() -> Result<Option<String>, String> + Send + Sync>;

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
                    health.set_problem("bird", None);
                    last_ok = true;
                }
                Ok(SyncOutcome::Unchanged) | Ok(SyncOutcome::NoBgp) => {
                    last_ok = true;
                }
                Err(problem) => {
                    tracing::warn!(%problem, "BIRD reload failed");
                    metrics.bird_failures.inc();
                    health.set_problem("bird", Some(problem));
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
) -> Result<SyncOutcome, String> {
    let Some(config) = render()? else {
        return Ok(SyncOutcome::NoBgp);
    };
    let current = tokio::fs::read(&target.config_path).await.ok();
    let changed = current.as_deref() != Some(config.as_bytes());
    if !changed && last_ok {
        return Ok(SyncOutcome::Unchanged);
    }
    if changed {
        write_config(&target.config_path, config.as_bytes())
            .await
            .map_err(|e| format!("write {}: {e}", target.config_path.display()))?;
    }
    configure(target).await?;
    Ok(SyncOutcome::Reloaded)
}

async fn write_config(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    let path = path.to_owned();
    let bytes = bytes.to_owned();
    tokio::task::spawn_blocking(move || {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|source| crate::Error::Store {
            op: "create directory",
            path: dir.to_owned(),
            source,
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bird.conf".into());
        write_durably(dir, &name, &bytes, 0o644)
    })
    .await
    .expect("config writer task panicked")
}

/// Runs `birdc -s SOCK configure` and interprets BIRD's reply.
pub async fn configure(target: &BirdTarget) -> Result<(), String> {
    let out = Command::new(&target.birdc)
        .arg("-s")
        .arg(&target.socket)
        .arg("configure")
        .output()
        .await
        .map_err(|e| format!("run {}: {e}", target.birdc.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let accepted = stdout.contains("Reconfigured")
        || stdout.contains("Reconfiguration in progress")
        || stdout.contains("Reconfiguration already in progress");
    if out.status.success() && accepted {
        Ok(())
    } else {
        Err(format!(
            "{} -s {} configure: {}{}",
            target.birdc.display(),
            target.socket.display(),
            stdout.trim(),
            stderr.trim()
        ))
    }
}
