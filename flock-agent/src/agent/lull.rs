//! Pauses in the agent's requests. Work that only tidies up after a request that was already
//! answered — deleting a released pod's veth, tens of milliseconds of the kernel's time with
//! its global rtnl lock held for part of them — waits for one, so it lands on no later
//! request: a pod's teardown comes in a rollout beside other pods' DELs and ADDs, each of
//! which would otherwise wait on the kernel behind it. It waits a bounded time, so a node that
//! never pauses still tidies up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How long no request must arrive for a pause.
pub const QUIET: Duration = Duration::from_millis(50);

/// How long tidying up waits for a pause at most.
pub const AT_MOST: Duration = Duration::from_millis(500);

/// When the last request arrived.
#[derive(Debug)]
pub struct Lull {
    epoch: Instant,
    /// Microseconds from `epoch` to the last request's arrival.
    last_us: AtomicU64,
}

impl Default for Lull {
    fn default() -> Self {
        Lull {
            epoch: Instant::now(),
            last_us: AtomicU64::new(0),
        }
    }
}

impl Lull {
    /// A request arrived.
    pub fn request(&self) {
        let us = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Returns once no request has arrived for [`QUIET`], or [`AT_MOST`] from now.
    pub async fn pause(&self) {
        self.pause_of(QUIET, AT_MOST).await;
    }

    async fn pause_of(&self, quiet: Duration, at_most: Duration) {
        let deadline = Instant::now() + at_most;
        loop {
            let last = self.epoch + Duration::from_micros(self.last_us.load(Ordering::Relaxed));
            let calm_at = last + quiet;
            let now = Instant::now();
            if calm_at <= now || deadline <= now {
                return;
            }
            tokio::time::sleep_until(calm_at.min(deadline)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pause_comes_a_quiet_time_after_the_last_request() {
        let lull = Lull::default();
        lull.request();
        tokio::time::advance(Duration::from_millis(20)).await;
        let started = Instant::now();
        lull.pause_of(Duration::from_millis(50), Duration::from_millis(500))
            .await;
        assert_eq!(started.elapsed(), Duration::from_millis(30));
        // No request for longer than the quiet time: at once.
        let started = Instant::now();
        lull.pause_of(Duration::from_millis(50), Duration::from_millis(500))
            .await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_never_pause_hold_it_back_only_so_long() {
        let lull = std::sync::Arc::new(Lull::default());
        let busy = {
            let lull = lull.clone();
            tokio::spawn(async move {
                loop {
                    lull.request();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        tokio::task::yield_now().await;
        let started = Instant::now();
        lull.pause_of(Duration::from_millis(50), Duration::from_millis(500))
            .await;
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        // The requests stop: the pause comes a quiet time after the last.
        busy.abort();
        let _ = busy.await;
        let last = lull.epoch + Duration::from_micros(lull.last_us.load(Ordering::Relaxed));
        lull.pause_of(Duration::from_millis(50), Duration::from_secs(10))
            .await;
        assert_eq!(Instant::now(), last + Duration::from_millis(50));
    }
}
