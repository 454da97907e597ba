//! What the plugin asks the cluster: flock's pods, NodeConfigs and the pods of the cluster
//! through the API, and each node's own state from its agent — `flock-agent inspect` run in
//! the agent's container through the API's exec. The agent's HTTP endpoints listen on the
//! node's loopback only and no new port is opened: exec goes through the apiserver and the
//! kubelet with the user's own credentials (RBAC `pods/exec` in flock's namespace).

use std::path::Path;
use std::time::Duration;

use flock_agent::inspect::NodeReport;
use flock_k8s_api::NodeConfig;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, AttachParams, ListParams, LogParams};
use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};

/// The label of the agent's pods (deploy/daemonset.yaml).
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=flock";
/// The label of BIRD's pods.
pub const BIRD_LABEL: &str = "app.kubernetes.io/name=flock-bird";
/// The agent's container.
pub const AGENT_CONTAINER: &str = "agent";
/// BIRD's container.
pub const BIRD_CONTAINER: &str = "bird";
/// How long one agent may take to answer an exec.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// One of flock's pods (an agent's or BIRD's) as the plugin shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlockPod {
    /// The pod's name.
    pub name: String,
    /// Its node.
    pub node: String,
    /// Whether it is Ready.
    pub ready: bool,
    /// Its first container's image.
    pub image: String,
    /// Restarts of its containers.
    pub restarts: i32,
    /// Its phase.
    pub phase: String,
}

impl FlockPod {
    fn of(pod: &Pod) -> FlockPod {
        let status = pod.status.as_ref();
        FlockPod {
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            image: pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_default(),
            restarts: status
                .and_then(|s| s.container_statuses.as_ref())
                .map(|c| c.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        }
    }
}

/// The cluster, as the plugin talks to it.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    /// The namespace flock runs in.
    pub namespace: String,
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { what, source }
}

impl Cluster {
    /// Connects with `kubeconfig`, else `$KUBECONFIG` or `~/.kube/config` (or in-cluster).
    pub async fn connect(kubeconfig: Option<&Path>, namespace: String) -> Result<Cluster> {
        let client = flock_k8s_api::client::client(kubeconfig).await?;
        Ok(Cluster { client, namespace })
    }

    /// The agents' pods; [`Error::NoFlock`] when there are none.
    pub async fn agents(&self) -> Result<Vec<FlockPod>> {
        let pods = self.flock_pods(AGENT_LABEL).await?;
        if pods.is_empty() {
            return Err(Error::NoFlock {
                found: format!(
                    "no pod labelled {AGENT_LABEL} in namespace {} (is flock installed? \
                     --namespace names another)",
                    self.namespace
                ),
            });
        }
        Ok(pods)
    }

    /// BIRD's pods.
    pub async fn birds(&self) -> Result<Vec<FlockPod>> {
        self.flock_pods(BIRD_LABEL).await
    }

    async fn flock_pods(&self, label: &str) -> Result<Vec<FlockPod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = api
            .list(&ListParams::default().labels(label))
            .await
            .map_err(api_error(format!(
                "list pods {label} in namespace {}",
                self.namespace
            )))?;
        let mut pods: Vec<FlockPod> = list.items.iter().map(FlockPod::of).collect();
        pods.sort_by(|a, b| a.node.cmp(&b.node).then(a.name.cmp(&b.name)));
        Ok(pods)
    }

    /// Every NodeConfig; [`Error::NoFlock`] when the API has no such resource.
    pub async fn node_configs(&self) -> Result<Vec<NodeConfig>> {
        let api: Api<NodeConfig> = Api::all(self.client.clone());
        match api.list(&ListParams::default()).await {
            Ok(l) => Ok(l.items),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::NoFlock {
                found: "the API has no nodeconfigs.flock.fritzlab.net (flock's CRDs are not \
                        installed)"
                    .to_owned(),
            }),
            Err(e) => Err(api_error("list nodeconfigs")(e)),
        }
    }

    /// Every pod of the cluster.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::all(self.client.clone());
        Ok(api
            .list(&ListParams::default())
            .await
            .map_err(api_error("list pods"))?
            .items)
    }

    /// One pod by namespace and name; [`Error::NotFound`] when there is none.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map_err(api_error(format!("get pod {namespace}/{name}")))?
            .ok_or_else(|| Error::NotFound {
                asked: format!("pod {namespace}/{name}"),
                found: format!("no such pod in namespace {namespace}"),
            })
    }

    /// A list of any kind (policies, namespaces) through `api`.
    pub async fn list<K>(&self, api: Api<K>, what: &str) -> Result<Vec<K>>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Ok(api
            .list(&ListParams::default())
            .await
            .map_err(api_error(format!("list {what}")))?
            .items)
    }

    /// The client, for the lists of [`list`](Self::list).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `flock-agent inspect [--dump]` in `agent`'s container: the node's report.
    pub async fn inspect(&self, agent: &FlockPod, dump: bool) -> Result<NodeReport> {
        let mut command = vec!["flock-agent", "inspect"];
        if dump {
            command.push("--dump");
        }
        let stdout = self.exec_ok(agent, AGENT_CONTAINER, &command).await?;
        serde_json::from_str(&stdout).map_err(|e| Error::Agent {
            node: agent.node.clone(),
            reason: format!(
                "`{}` printed what is not a node report ({e}); is the agent's image older than \
                 this plugin?",
                command.join(" ")
            ),
        })
    }

    /// Runs `command` in `container` of `pod`; its stdout when it exits 0, else
    /// [`Error::Agent`] with its stderr.
    pub async fn exec_ok(
        &self,
        pod: &FlockPod,
        container: &str,
        command: &[&str],
    ) -> Result<String> {
        let failed = |reason: String| Error::Agent {
            node: pod.node.clone(),
            reason: format!(
                "pod {}/{}: `{}`: {reason}",
                self.namespace,
                pod.name,
                command.join(" ")
            ),
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = AttachParams::default()
            .container(container)
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let run = async {
            let mut process = api
                .exec(&pod.name, command.iter().copied(), &params)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let mut stdout = process.stdout().ok_or_else(|| failed("no stdout".into()))?;
            let mut stderr = process.stderr().ok_or_else(|| failed("no stderr".into()))?;
            let status = process
                .take_status()
                .ok_or_else(|| failed("no status".into()))?;
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let (o, e) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
            o.and(e).map_err(|e| failed(e.to_string()))?;
            let status = status.await;
            let _ = process.join().await;
            let success = status
                .as_ref()
                .and_then(|s| s.status.as_deref())
                .is_some_and(|s| s == "Success");
            if success {
                Ok(String::from_utf8_lossy(&out).into_owned())
            } else {
                let why = status.and_then(|s| s.message).unwrap_or_default();
                Err(failed(format!(
                    "{why}: {}",
                    String::from_utf8_lossy(&err).trim()
                )))
            }
        };
        match tokio::time::timeout(EXEC_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => Err(failed(format!("no answer in {} s", EXEC_TIMEOUT.as_secs()))),
        }
    }

    /// The log of `container` of `pod` (the last 10,000 lines; `previous`: of the container
    /// before its last restart). flock's lines carry their own time stamps.
    pub async fn logs(&self, pod: &FlockPod, container: &str, previous: bool) -> Result<String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = LogParams {
            container: Some(container.to_owned()),
            tail_lines: Some(10_000),
            previous,
            ..LogParams::default()
        };
        api.logs(&pod.name, &params)
            .await
            .map_err(api_error(format!(
                "logs of {}/{}",
                self.namespace, pod.name
            )))
    }
}
