//! Waiting in async tests for something another task does.

use std::time::Duration;

/// How long [`eventually`] waits before it fails the test.
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// Polls `check` every 10 ms until it holds; panics naming `what` after [`EVENTUALLY`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {} s waiting for: {what}",
            EVENTUALLY.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
