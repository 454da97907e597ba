//! Kubernetes mode of `flock-agent run`.

use crate::daemon::RunOptions;
use crate::{Error, Result};

/// Runs the agent against the Kubernetes API.
pub async fn run(_options: RunOptions) -> Result<()> {
    Err(Error::InvalidNodeConfig {
        field: "--standalone".into(),
        value: "false".into(),
        reason:
            "Kubernetes mode is not built yet (issue 7); run with --standalone --node-config FILE"
                .into(),
    })
}
