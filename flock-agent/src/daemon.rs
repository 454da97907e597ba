//! `flock-agent run`: assembles the agent — store and start-up reconcile, DEL queue drain,
//! BIRD writer, RPC server, metrics — and runs until SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flock_netns::NodeNs;

use crate::kernel::NetnsKernel;
use crate::trace::Tracer;
use tracing::{info, warn};

use crate::agent::{Agent, AgentParts};
use crate::metrics::{Health, Metrics};
use crate::routing::bird::{BirdTarget, Debounce};
use crate::{Error, Result};
use flock_k8s_api::NodeConfig;

/// The default paths and addresses of DESIGN §9 (the command line's defaults; the manifests
/// under `deploy/` use the same, which a test checks). What the shim shares with the agent is
/// defined once, in `flock_rpc::defaults`.
pub mod defaults {
    /// The RPC socket the shim connects to.
    pub const SOCKET: &str = flock_rpc::defaults::DEFAULT_AGENT_SOCKET;
    /// Where allocations are persisted.
    pub const STATE_DIR: &str = flock_rpc::defaults::DEFAULT_STATE_DIR;
    /// The BIRD configuration file the agent renders.
    pub const BIRD_CONFIG: &str = "/etc/flock/bird/bird.conf";
    /// BIRD's control socket.
    pub const BIRD_SOCKET: &str = "/run/flock/bird.ctl";
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub const METRICS_ADDR: &str = "127.0.0.1:9641";
    /// The CNI binary directory.
    pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
    /// The CNI configuration directory.
    pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";
}

/// How often the DEL queue is drained while serving (a shim may have queued a DEL while the
/// agent was briefly unreachable).
pub const DRAIN_INTERVAL: Duration = Duration::from_secs(10);

/// Everything `flock-agent run` is told.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Standalone: the NodeConfig file.
    pub node_config: Option<PathBuf>,
    /// The node's name.
    pub node: Option<String>,
    /// The RPC socket.
    pub socket: PathBuf,
    /// The state directory.
    pub state_dir: PathBuf,
    /// The DEL queue directory the shim writes to.
    pub del_queue_dir: PathBuf,
    /// BIRD.
    pub bird: BirdTarget,
    /// BIRD reload debounce.
    pub debounce: Debounce,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics_addr: SocketAddr,
    /// Seed of the allocation RNG (`main` reads it from the OS).
    pub rng_seed: [u8; 32],
    /// Test hook (`FLOCK_FAILPOINT`): abort at this point of an ADD.
    pub failpoint: Option<String>,
    /// `--trace FILE`: one JSON line of phases per request.
    pub trace: Option<PathBuf>,
}

impl RunOptions {
    /// The agent's parts for these options, on the kernel of the agent's own namespace.
    pub fn agent_parts(&self) -> Result<AgentParts> {
        let tracer = match &self.trace {
            None => None,
            Some(path) => Some(Tracer::create(path).map_err(|source| Error::WriteFile {
                what: "request trace",
                op: "create",
                path: path.clone(),
                source,
            })?),
        };
        Ok(AgentParts {
            rng_seed: self.rng_seed,
            failpoint: self.failpoint.clone(),
            tracer,
            ..AgentParts::new(
                Arc::new(NetnsKernel::new(NodeNs::current())),
                self.state_dir.clone(),
            )
        })
    }
}

/// Runs the standalone agent until a termination signal.
pub async fn run_standalone(options: RunOptions) -> Result<()> {
    let path = options.node_config.clone().ok_or_else(|| {
        Error::from(flock_k8s_api::Error::InvalidNodeConfig {
            field: "--node-config".into(),
            value: String::new(),
            reason: "standalone mode needs a NodeConfig file".into(),
        })
    })?;
    let node_config = read_node_config(&path)?;
    let mut settings = node_config.settings()?;
    if let Some(node) = &options.node {
        if *node != settings.node {
            return Err(Error::from(flock_k8s_api::Error::InvalidNodeConfig {
                field: "metadata.name".into(),
                value: settings.node.clone(),
                reason: format!("the file is for another node than --node {node}"),
            }));
        }
        settings.node = node.clone();
    }
    read_password_files(&mut settings)?;
    info!(node = %settings.node, file = %path.display(), "standalone mode");
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let (agent, report) = Agent::start(AgentParts {
        settings: Some(settings),
        metrics: metrics.clone(),
        health: health.clone(),
        ..options.agent_parts()?
    })
    .await?;
    serve(agent, report, options, metrics, health).await
}

/// Reads a NodeConfig from a YAML file (standalone mode).
fn read_node_config(path: &std::path::Path) -> Result<NodeConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    serde_yaml::from_str(&text).map_err(|e| Error::NodeConfigFile {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Standalone mode: each `passwordFile` read into the BGP model (a trailing newline dropped).
/// A file that cannot be read, or a password BIRD could not take, stops the start with an
/// error naming the neighbor and the file, never the password.
fn read_password_files(settings: &mut flock_k8s_api::NodeSettings) -> Result<()> {
    if let Some((index, reference)) = settings.password_secrets.first() {
        return Err(Error::from(flock_k8s_api::Error::InvalidNodeConfig {
            field: format!("spec.bgp.neighbors[{index}].passwordSecretRef"),
            value: reference.to_string(),
            reason: "Secrets are read in Kubernetes mode only; use passwordFile in standalone mode"
                .into(),
        }));
    }
    let files = settings.password_files.clone();
    let Some(model) = settings.bgp.as_mut() else {
        return Ok(());
    };
    for (index, path) in files {
        let field = format!("spec.bgp.neighbors[{index}].passwordFile");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::from(flock_k8s_api::Error::InvalidNodeConfig {
                field: field.clone(),
                value: path.display().to_string(),
                reason: format!("cannot read the password file: {e}"),
            })
        })?;
        if let Some(n) = model.neighbors.get_mut(index) {
            n.password = Some(text.trim_end_matches(['\n', '\r']).to_owned());
        }
    }
    model.validate().map_err(|e| {
        Error::from(flock_k8s_api::Error::InvalidNodeConfig {
            field: "spec.bgp".into(),
            value: String::new(),
            reason: e.to_string(),
        })
    })?;
    Ok(())
}

/// The common part of both modes, once the agent has started.
pub async fn serve(
    agent: Arc<Agent>,
    mut report: crate::agent::StartupReport,
    options: RunOptions,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<()> {
    report.drained_dels = agent.drain_del_queue(&options.del_queue_dir).await;
    info!(?report, "start-up reconcile done");

    let renderer = {
        let agent = agent.clone();
        Arc::new(move || agent.render_bird()) as crate::routing::bird::Renderer
    };
    let bird = crate::routing::bird::spawn(
        options.bird.clone(),
        renderer,
        options.debounce,
        metrics.clone(),
        health.clone(),
    );
    agent.set_bird(bird);

    let http = tokio::net::TcpListener::bind(options.metrics_addr)
        .await
        .map_err(|source| Error::Socket {
            op: "bind metrics address",
            path: PathBuf::from(options.metrics_addr.to_string()),
            source,
        })?;
    let router = crate::metrics::router(metrics.clone(), health.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(http, router).await {
            warn!(error = %e, "metrics server stopped");
        }
    });

    let listener = crate::server::bind(&options.socket)?;
    // Serving: a predecessor's restart notice has done its work.
    let notice = flock_rpc::rpc::restart_notice(&options.socket);
    if let Err(e) = std::fs::remove_file(&notice)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        warn!(notice = %notice.display(), error = %e, "cannot remove the restart notice");
    }
    health.set_serving();
    info!(socket = %options.socket.display(), "serving");
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::server::serve(
        listener,
        agent.clone(),
        options.socket.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    {
        let agent = agent.clone();
        let dir = options.del_queue_dir.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(DRAIN_INTERVAL).await;
                agent.drain_del_queue(&dir).await;
            }
        });
    }

    shutdown_signal().await;
    // The notice first, then the socket: a STATUS never finds neither (rpc::restart_notice).
    let notice = flock_rpc::rpc::restart_notice(&options.socket);
    match std::fs::write(&notice, format!("pid {}\n", std::process::id())) {
        Ok(()) => info!(notice = %notice.display(), "terminating; restart notice left"),
        Err(e) => {
            warn!(notice = %notice.display(), error = %e, "terminating; cannot leave the restart notice")
        }
    }
    let _ = std::fs::remove_file(&options.socket);
    // Then the requests already taken, or waiting to be, are answered (server::serve).
    let _ = stop_serving.send(());
    let _ = server.await;
    // Last, the records in the store's slots file into files of their own, which an agent
    // of any version reads (a rollback; see `store`).
    agent.retire_store().await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(neighbor: &str) -> flock_k8s_api::NodeSettings {
        let yaml = format!(
            "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {{ name: host001 }}
spec:
  cidr6: 2001:db8:0:1::/64
  bgp:
    asn: 64512
    routerId: 10.0.0.1
    neighbors:
      - {neighbor}
"
        );
        serde_yaml::from_str::<NodeConfig>(&yaml)
            .expect("yaml")
            .settings()
            .expect("valid")
    }

    #[test]
    fn standalone_reads_password_files_and_refuses_secrets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tor-a.password");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut s = settings(&format!(
            "{{ address: \"2001:db8::fe\", asn: 65000, passwordFile: {} }}",
            file.display()
        ));
        read_password_files(&mut s).expect("readable");
        let model = s.bgp.expect("bgp");
        assert_eq!(model.neighbors[0].password.as_deref(), Some("s3cret"));

        let mut s = settings(&format!(
            "{{ address: \"2001:db8::fe\", asn: 65000, passwordFile: {} }}",
            dir.path().join("missing").display()
        ));
        let e = read_password_files(&mut s)
            .expect_err("missing file")
            .to_string();
        assert!(
            e.contains("spec.bgp.neighbors[0].passwordFile") && e.contains("missing"),
            "{e}"
        );

        std::fs::write(&file, "bad\"quote").unwrap();
        let mut s = settings(&format!(
            "{{ address: \"2001:db8::fe\", asn: 65000, passwordFile: {} }}",
            file.display()
        ));
        let e = read_password_files(&mut s)
            .expect_err("unusable")
            .to_string();
        assert!(e.contains("password for 2001:db8::fe"), "{e}");
        assert!(!e.contains("bad\"quote"), "the password leaked: {e}");

        let mut s = settings(
            "{ address: \"2001:db8::fe\", asn: 65000, passwordSecretRef: { name: p, namespace: kube-system, key: k } }",
        );
        let e = read_password_files(&mut s)
            .expect_err("no Secrets")
            .to_string();
        assert!(e.contains("Kubernetes mode only"), "{e}");
    }
}
