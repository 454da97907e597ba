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
