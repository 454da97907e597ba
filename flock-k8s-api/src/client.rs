//! A client of the cluster that holds the resources, configured the way every flock program
//! (the agent, the pool controller, the kubectl plugin) needs it: from a kubeconfig file when
//! one is named, else in-cluster (the service account) or `$KUBECONFIG`. Behind the `client`
//! feature: it brings kube's HTTP client and TLS.

use std::path::Path;

use kube::Client;

/// A client could not be set up: what was being done, and the cause.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct ClientError {
    /// The step (`read kubeconfig /path`, `build the client`).
    pub op: String,
    /// kube's error.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

fn failed<E>(op: String) -> impl FnOnce(E) -> ClientError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| ClientError {
        op,
        source: Box::new(e),
    }
}

/// A client from `kubeconfig`, or from the in-cluster service account / `$KUBECONFIG`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(failed(format!("read kubeconfig {}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(failed(format!("load kubeconfig {}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(failed(
            "infer the client config (in-cluster service account or $KUBECONFIG)".to_owned(),
        ))?,
    };
    Client::try_from(config).map_err(failed("build the client".to_owned()))
}

/// A duration flag of a flock program, one syntax for all: `300` (seconds), `250ms`, `90s`,
/// `10m`, `1h 30m` (jiff's friendly format); never negative. The error names the text.
pub fn duration_flag(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(seconds));
    }
    let d: k8s_openapi::jiff::SignedDuration = text.parse().map_err(|e| {
        format!("{text:?} is not a duration like 300 (seconds), 250ms, 90s, 10m or 1h 30m: {e}")
    })?;
    std::time::Duration::try_from(d).map_err(|_| format!("{text:?} is negative"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::duration_flag;

    #[test]
    fn one_duration_syntax_for_every_flag() {
        for (text, want) in [
            ("300", Duration::from_secs(300)),
            ("250ms", Duration::from_millis(250)),
            ("90s", Duration::from_secs(90)),
            (" 5m ", Duration::from_secs(300)),
            ("1h 30m", Duration::from_secs(5400)),
        ] {
            assert_eq!(duration_flag(text), Ok(want), "{text}");
        }
        for bad in ["", "5 parsecs", "-5m", "m"] {
            let e = duration_flag(bad).expect_err(bad);
            assert!(e.contains(&format!("{:?}", bad.trim())), "{e}");
        }
    }
}
